// A GGUF tensor's ggml blocks into the buffers of tr's int4/int5/int8 kernels in one pass (built with tr's
// other kernels: models/native_kernels.py; models/gguf_tensors.py calls it at every start of a GGUF).
//
// The same numbers as models/gguf_blocks.py's torch reading (the reference its tests compare with),
// ~50x faster: as torch ops a 0.5B model's conversion took seconds of every start (nibble splits,
// concatenations and the column-block permutation, each a pass over the weights).
//
// It also takes the k-quants and legacy types a kind cannot hold as stored (into int8: Q4_0, Q4_1,
// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, as any model's Q6_K layers; into int4 and int5: Q2_K, Q3_K): each
// group's values as gguf's own dequantize computes them in float32, then quantized as the kind's
// `_quantize` (weights.py) quantizes a float weight, bit for bit the same (its tests compare with that
// Python route, which stays for the other types). A 0.5B Qwen2's 24 Q4_K/Q6_K down projections took
// 0.86 s of every start through numpy and torch.
//
// raw: uint8 (rows, row bytes), rows of one tensor; levels (blocks, K/32, 128 | 160 | 256), steps and
// minimums (blocks, K/32, 8) as weights.py lays them out (_column_blocks, _column_values): block b
// holds rows 8b..8b+7, a row past `rows` is left as it is (the caller's zero padding).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kGroup = 32, kColumns = 8;
// ggml type ids (ggml.h)
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                  kQ6_K = 14;

inline uint16_t half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
inline float half_value(const uint8_t* p) { return _cvtsh_ss(half_bits(p)); }
inline uint16_t to_half(float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }

// One group of 32 inputs of one row: its levels in input order, its step and minimum (float16 bits).
struct Group {
  uint8_t level[kGroup];
  uint16_t step, minimum;
};

void nibbles(const uint8_t* qs, uint8_t* level) {
  for (int j = 0; j < 16; ++j) {
    level[j] = qs[j] & 15;
    level[j + 16] = qs[j] >> 4;
  }
}

// Q4_K's and Q5_K's 6-bit scale and minimum of group j (0..7) of a super-block.
inline void k_scale_min(const uint8_t* s, int j, int& scale, int& minimum) {
  if (j < 4) {
    scale = s[j] & 63;
    minimum = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    minimum = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q5_0's and Q5_1's 32 levels 0-31: nibbles, fifth bits in a 32-bit word.
void five_bit_levels(const uint8_t* qh, const uint8_t* qs, uint8_t* level) {
  uint32_t high;
  std::memcpy(&high, qh, 4);
  for (int j = 0; j < 16; ++j) {
    level[j] = static_cast<uint8_t>((qs[j] & 15) | (((high >> j) & 1) << 4));
    level[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((high >> (j + 16)) & 1) << 4));
  }
}

// Group g of a row of a requantized type: its 32 values, in gguf's dequantize's order of operations.
// Every product here is exact in float32 (a float16 step of 11 significant bits, times a k-quant's
// scale of at most 7, times a level of at most 6: at most 24 bits), so a multiply-add the compiler
// fuses rounds as numpy's two operations do.
void group_values(int64_t type, const uint8_t* row, int64_t g, float* value) {
  switch (type) {
    case kQ4_0: {  // d (q - 8)
      const uint8_t* b = row + g * 18;
      const float d = half_value(b);
      for (int j = 0; j < 16; ++j) {
        value[j] = d * static_cast<float>((b[2 + j] & 15) - 8);
        value[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
      }
      break;
    }
    case kQ4_1: {  // d q + m
      const uint8_t* b = row + g * 20;
      const float d = half_value(b), m = half_value(b + 2);
      for (int j = 0; j < 16; ++j) {
        value[j] = d * static_cast<float>(b[4 + j] & 15) + m;
        value[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
      }
      break;
    }
    case kQ5_1: {  // d q + m, q's fifth bits in a 32-bit word
      const uint8_t* b = row + g * 24;
      const float d = half_value(b), m = half_value(b + 2);
      uint8_t level[kGroup];
      five_bit_levels(b + 4, b + 8, level);
      for (int l = 0; l < kGroup; ++l) value[l] = d * static_cast<float>(level[l]) + m;
      break;
    }
    case kQ4_K:
    case kQ5_K: {  // (d sc) q - (dmin m); Q5_K: q's fifth bit j of 32 bytes after the scales
      const bool five = type == kQ5_K;
      const uint8_t* b = row + (g / 8) * (five ? 176 : 144);
      const int j = static_cast<int>(g % 8);
      int scale, minimum;
      k_scale_min(b + 4, j, scale, minimum);
      const float a = half_value(b) * static_cast<float>(scale);
      const float m = half_value(b + 2) * static_cast<float>(minimum);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + 16 + (five ? 32 : 0) + (j / 2) * 32;
      const int shift = (j % 2) * 4;
      for (int l = 0; l < kGroup; ++l) {
        int q = (qs[l] >> shift) & 15;
        if (five) q |= ((qh[l] >> j) & 1) << 4;
        value[l] = a * static_cast<float>(q) - m;
      }
      break;
    }
    case kQ2_K: {  // (d sc) q - (dmin m), a 4-bit sc and m per 16 values; 2-bit q, 64 bytes of four each
      const uint8_t* b = row + (g / 8) * 84;
      const int j = static_cast<int>(g % 8), shift = (j % 4) * 2;
      const float d = half_value(b + 80), dmin = half_value(b + 82);
      const uint8_t* qs = b + 16 + (j / 4) * 32;
      for (int l = 0; l < kGroup; ++l) {
        const uint8_t sm = b[2 * j + l / 16];
        const float a = d * static_cast<float>(sm & 15), m = dmin * static_cast<float>(sm >> 4);
        value[l] = a * static_cast<float>((qs[l] >> shift) & 3) - m;
      }
      break;
    }
    case kQ3_K: {  // (d (sc - 32)) (q - 4 (1 - h)), a 6-bit sc per 16 values; 2-bit q, their third bits in 32 bytes
      const uint8_t* b = row + (g / 8) * 110;
      const int j = static_cast<int>(g % 8), shift = (j % 4) * 2;
      const float d = half_value(b + 108);
      const uint8_t* hmask = b;
      const uint8_t* qs = b + 32 + (j / 4) * 32;
      const uint8_t* sc = b + 96;
      for (int l = 0; l < kGroup; ++l) {
        const int k = 2 * j + l / 16;  // the scale's index, 0..15
        const int low = (k < 8 ? sc[k] : sc[k - 8] >> 4) & 15, high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        const float scale = static_cast<float>(static_cast<int8_t>(low | (high << 4)) - 32);
        const int q = ((qs[l] >> shift) & 3) - (((hmask[l] >> j) & 1) ? 0 : 4);
        value[l] = (d * scale) * static_cast<float>(q);
      }
      break;
    }
    case kQ6_K: {  // (d scale) (q - 32), a scale per 16 values; 128 bytes low nibbles, 64 high pairs
      const uint8_t* b = row + (g / 8) * 210;
      const int j = static_cast<int>(g % 8), half = j / 4, quarter = j % 4;
      const float d = half_value(b + 208);
      const uint8_t* ql = b + half * 64 + (quarter % 2) * 32;
      const uint8_t* qh = b + 128 + half * 32;
      const int low_shift = (quarter / 2) * 4, high_shift = quarter * 2;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      for (int l = 0; l < kGroup; ++l) {
        const int q = (((ql[l] >> low_shift) & 15) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
        value[l] = (d * static_cast<float>(scales[2 * j + l / 16])) * static_cast<float>(q);
      }
      break;
    }
    default:
      TORCH_CHECK(false, "gguf_repack: ggml type ", type, " is not requantized here");
  }
}

// The kernels' kinds of buffers: int4 and int5 (levels 0-15 / 0-31, a step and a minimum), int8.
enum class Kind { kInt4, kInt5, kInt8 };

// The types group_values reads: requantized into int8 buffers (all of them) and int4/int5 ones (Q2_K,
// Q3_K; Q4_0/Q4_1/Q4_K go into int4 and int5 as stored, Q5_0/Q5_1/Q5_K into int5).
bool requantized(int64_t type, Kind kind) {
  if (kind != Kind::kInt8) return type == kQ2_K || type == kQ3_K;
  return type == kQ4_0 || type == kQ4_1 || type == kQ5_1 || type == kQ2_K || type == kQ3_K || type == kQ4_K ||
         type == kQ5_K || type == kQ6_K;
}

// A group's values as four vectors, and their minimum and maximum.
void extremes(const float* value, __m256* v, float& least, float& most) {
  __m256 low = _mm256_loadu_ps(value), high = low;
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(value + 8 * i);
    low = _mm256_min_ps(low, v[i]);
    high = _mm256_max_ps(high, v[i]);
  }
  alignas(32) float lows[8], highs[8];
  _mm256_store_ps(lows, low);
  _mm256_store_ps(highs, high);
  least = lows[0];
  most = highs[0];
  for (int i = 1; i < 8; ++i) {
    least = std::min(least, lows[i]);
    most = std::max(most, highs[i]);
  }
}

// Levels round((v - from) / by) half to even, clamped to [floor, ceiling] (a NaN of a damaged file:
// floor, never out of range), as bytes in input order: the same IEEE subtractions, divisions and
// roundings as torch's, in vectors (the scalar loop rounded through a libm call a weight).
void store_levels(const __m256* v, __m256 from, __m256 by, float floor, float ceiling, uint8_t* level) {
  const __m256 low = _mm256_set1_ps(floor), high = _mm256_set1_ps(ceiling);
  __m256i whole[4];
  for (int i = 0; i < 4; ++i) {  // from 0 (int8) subtracts exactly: v comes back as it is
    const __m256 x = _mm256_sub_ps(v[i], from);
    const __m256 rounded = _mm256_round_ps(_mm256_div_ps(x, by), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    whole[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rounded, low), high));
  }
  // packs interleave 128-bit lanes: bytes come out as 4-value runs of 0,2,4,6,1,3,5,7; put them back
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(whole[0], whole[1]), _mm256_packs_epi32(whole[2], whole[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(level),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// weights.py's _float16: clamped to float16's finite range, then rounded to it (bits).
inline uint16_t finite_half(float x) { return to_half(std::min(std::max(x, -65504.0f), 65504.0f)); }

// The step a group's levels are divided by: its float16 value, 1 where it is 0 (_quantize's masked_fill).
inline __m256 divisor_of(uint16_t step) {
  const float value = _cvtsh_ss(step);
  return _mm256_set1_ps(value == 0.0f ? 1.0f : value);
}

// Q8Linear._quantize of one group: step = float16(max(-min, max) / 127) (1 where it is 0 in the
// division), levels round(value / step) half to even, clamped to -127..127.
void quantize_int8(const float* value, Group& out) {
  __m256 v[4];
  float least, most;
  extremes(value, v, least, most);
  out.step = finite_half(std::max(-least, most) / 127.0f);
  out.minimum = 0;
  store_levels(v, _mm256_setzero_ps(), divisor_of(out.step), -127.0f, 127.0f, out.level);
}

// Q4Linear._quantize (top 15) and Q5Linear._quantize (top 31) of one group: step float16((max - min) /
// top), minimum float16(min), levels round((value - minimum) / step) (step 1 where it is 0) half to
// even, clamped to 0..top.
void quantize_from_minimum(const float* value, float top, Group& out) {
  __m256 v[4];
  float least, most;
  extremes(value, v, least, most);
  out.step = finite_half((most - least) / top);
  out.minimum = finite_half(least);
  store_levels(v, _mm256_set1_ps(_cvtsh_ss(out.minimum)), divisor_of(out.step), 0.0f, top, out.level);
}

void read_group(int64_t type, Kind kind, const uint8_t* row, int64_t g, Group& out) {
  if (requantized(type, kind)) {
    float value[kGroup];
    group_values(type, row, g, value);
    if (kind == Kind::kInt8) quantize_int8(value, out);
    else quantize_from_minimum(value, kind == Kind::kInt5 ? 31.0f : 15.0f, out);
    return;
  }
  switch (type) {
    case kQ4_0: {  // d, 16 bytes of nibbles; value (q - 8) d
      const uint8_t* b = row + g * 18;
      out.step = half_bits(b);
      out.minimum = to_half(half_value(b) * -8.0f);
      nibbles(b + 2, out.level);
      break;
    }
    case kQ4_1: {  // d, m, nibbles; value q d + m
      const uint8_t* b = row + g * 20;
      out.step = half_bits(b);
      out.minimum = half_bits(b + 2);
      nibbles(b + 4, out.level);
      break;
    }
    case kQ8_0: {  // d, 32 int8; value q d
      const uint8_t* b = row + g * 34;
      out.step = half_bits(b);
      out.minimum = 0;
      std::memcpy(out.level, b + 2, kGroup);
      break;
    }
    case kQ5_0: {  // d, 32 fifth bits, nibbles; value (q - 16) d: int5 levels q with minimum -16 d, int8 q - 16
      const uint8_t* b = row + g * 22;
      out.step = half_bits(b);
      five_bit_levels(b + 2, b + 6, out.level);
      if (kind == Kind::kInt5) {
        out.minimum = to_half(half_value(b) * -16.0f);
      } else {
        out.minimum = 0;
        for (int l = 0; l < kGroup; ++l) out.level[l] = static_cast<uint8_t>(static_cast<int8_t>(out.level[l] - 16));
      }
      break;
    }
    case kQ5_1: {  // d, m, 32 fifth bits, nibbles; value q d + m (into int5 only: int8 requantizes it)
      const uint8_t* b = row + g * 24;
      out.step = half_bits(b);
      out.minimum = half_bits(b + 2);
      five_bit_levels(b + 4, b + 8, out.level);
      break;
    }
    case kQ4_K:
    case kQ5_K: {  // super-blocks of 8 groups: d, dmin, 12 bytes of 6-bit scales/minimums, (Q5_K: 32 bytes
                   // of fifth bits, bit j for group j,) 128 bytes of nibbles
      const bool five = type == kQ5_K;
      const uint8_t* b = row + (g / 8) * (five ? 176 : 144);
      const int j = static_cast<int>(g % 8);
      int scale, minimum;
      k_scale_min(b + 4, j, scale, minimum);
      out.step = to_half(half_value(b) * static_cast<float>(scale));
      out.minimum = to_half(-half_value(b + 2) * static_cast<float>(minimum));
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + 16 + (five ? 32 : 0) + (j / 2) * 32;
      const int shift = (j % 2) * 4;
      for (int l = 0; l < kGroup; ++l) out.level[l] = ((qs[l] >> shift) & 15) | (five ? ((qh[l] >> j) & 1) << 4 : 0);
      break;
    }
    default:
      TORCH_CHECK(false, "gguf_repack: ggml type ", type, " is not read here");
  }
}

void gguf_repack(const at::Tensor& raw, int64_t type, int64_t columns, const at::Tensor& levels,
                 const at::Tensor& steps, const c10::optional<at::Tensor>& minimums) {
  // int4 and int5 buffers have minimums, int5's levels 160 bytes a group (quantized_matmul.cpp)
  const bool int4 = minimums.has_value();
  const Kind kind = !int4 ? Kind::kInt8 : levels.dim() == 3 && levels.size(2) == 160 ? Kind::kInt5 : Kind::kInt4;
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.is_contiguous(),
              "gguf_repack: raw must be contiguous uint8 (rows, row bytes)");
  const bool nibbles_as_stored = type == kQ4_0 || type == kQ4_1 || type == kQ4_K;
  const bool fives_as_stored = type == kQ5_0 || type == kQ5_1 || type == kQ5_K;
  TORCH_CHECK(kind == Kind::kInt4   ? nibbles_as_stored || requantized(type, kind)
              : kind == Kind::kInt5 ? nibbles_as_stored || fives_as_stored || requantized(type, kind)
                                    : type == kQ8_0 || type == kQ5_0 || requantized(type, kind),
              "gguf_repack: int4 buffers take Q4_0/Q4_1/Q4_K and (requantized) Q2_K/Q3_K, int5 ones those and "
              "Q5_0/Q5_1/Q5_K, int8 ones Q8_0/Q5_0 and (requantized) Q4_0/Q4_1/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K");
  TORCH_CHECK(columns % kGroup == 0, "gguf_repack: columns must be a multiple of 32");
  const int64_t rows = raw.size(0), groups = columns / kGroup, blocks = (rows + kColumns - 1) / kColumns;
  const int64_t group_bytes = kind == Kind::kInt4 ? 128 : kind == Kind::kInt5 ? 160 : 256;
  TORCH_CHECK(levels.is_contiguous() && levels.dim() == 3 && levels.size(0) >= blocks && levels.size(1) == groups &&
                  levels.size(2) == group_bytes && levels.element_size() == 1,
              "gguf_repack: levels must be contiguous (blocks, K/32, ", group_bytes, ")");
  TORCH_CHECK(steps.is_contiguous() && steps.scalar_type() == at::kHalf && steps.numel() >= blocks * groups * kColumns,
              "gguf_repack: steps must be contiguous float16 (blocks, K/32, 8)");
  if (int4) {
    TORCH_CHECK(minimums->is_contiguous() && minimums->scalar_type() == at::kHalf &&
                    minimums->numel() >= blocks * groups * kColumns,
                "gguf_repack: minimums must be contiguous float16 (blocks, K/32, 8)");
  }
  const uint8_t* in = raw.data_ptr<uint8_t>();
  const int64_t row_bytes = raw.size(1);
  uint8_t* out = static_cast<uint8_t*>(levels.data_ptr());
  uint16_t* step_out = static_cast<uint16_t*>(steps.data_ptr());
  uint16_t* minimum_out = int4 ? static_cast<uint16_t*>(minimums->data_ptr()) : nullptr;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    Group group;
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* dst = out + (b * groups + g) * group_bytes;
        const int64_t values = (b * groups + g) * kColumns;
        for (int64_t c = 0; c < kColumns; ++c) {
          const int64_t row = b * kColumns + c;
          if (row >= rows) break;
          read_group(type, kind, in + row * row_bytes, g, group);
          step_out[values + c] = group.step;
          if (int4) {
            minimum_out[values + c] = group.minimum;
            for (int v = 0; v < 4; ++v)  // vector v: inputs 4v..4v+3 low, 4(v+4).. high
              for (int i = 0; i < 4; ++i)
                dst[v * 32 + c * 4 + i] = (group.level[4 * v + i] & 15) | (group.level[4 * (v + 4) + i] << 4);
            if (kind == Kind::kInt5) {  // fifth bits: bit v of byte 4c + i is vector v's
              for (int i = 0; i < 4; ++i) {
                uint8_t fifth = 0;
                for (int v = 0; v < 8; ++v) fifth |= ((group.level[4 * v + i] >> 4) & 1) << v;
                dst[128 + c * 4 + i] = fifth;
              }
            }
          } else {
            for (int v = 0; v < 8; ++v) std::memcpy(dst + v * 32 + c * 4, group.level + 4 * v, 4);
          }
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) {
  m.def(
      "gguf_repack(Tensor raw, int ggml_type, int columns, Tensor(a!) levels, Tensor(b!) steps, "
      "Tensor(c!)? minimums) -> ()");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) { m.impl("gguf_repack", &gguf_repack); }
