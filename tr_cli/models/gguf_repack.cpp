// A GGUF tensor's ggml blocks into the buffers of tr's int4/int8 kernels in one pass (built with tr's
// other kernels: models/native_kernels.py; models/gguf_tensors.py calls it at every start of a GGUF).
//
// The same numbers as models/gguf_blocks.py's torch reading (the reference its tests compare with),
// ~50x faster: as torch ops a 0.5B model's conversion took seconds of every start (nibble splits,
// concatenations and the column-block permutation, each a pass over the weights).
//
// raw: uint8 (rows, row bytes), rows of one tensor; levels (blocks, K/32, 128 | 256), steps and
// minimums (blocks, K/32, 8) as weights.py lays them out (_column_blocks, _column_values): block b
// holds rows 8b..8b+7, a row past `rows` is left as it is (the caller's zero padding).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kGroup = 32, kColumns = 8;
// ggml type ids (ggml.h)
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12;

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

void read_group(int64_t type, const uint8_t* row, int64_t g, Group& out) {
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
    case kQ5_0: {  // d, 32 fifth bits, nibbles; value (q - 16) d
      const uint8_t* b = row + g * 22;
      uint32_t high;
      std::memcpy(&high, b + 2, 4);
      out.step = half_bits(b);
      out.minimum = 0;
      for (int j = 0; j < 16; ++j) {
        const int lo = (b[6 + j] & 15) | (((high >> j) & 1) << 4);
        const int hi = (b[6 + j] >> 4) | (((high >> (j + 16)) & 1) << 4);
        out.level[j] = static_cast<uint8_t>(static_cast<int8_t>(lo - 16));
        out.level[j + 16] = static_cast<uint8_t>(static_cast<int8_t>(hi - 16));
      }
      break;
    }
    case kQ4_K: {  // super-blocks of 8 groups: d, dmin, 12 bytes of 6-bit scales/minimums, 128 bytes of nibbles
      const uint8_t* b = row + (g / 8) * 144;
      const int j = static_cast<int>(g % 8);
      const uint8_t* s = b + 4;
      int scale, minimum;
      if (j < 4) {
        scale = s[j] & 63;
        minimum = s[j + 4] & 63;
      } else {
        scale = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        minimum = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      }
      out.step = to_half(half_value(b) * static_cast<float>(scale));
      out.minimum = to_half(-half_value(b + 2) * static_cast<float>(minimum));
      const uint8_t* qs = b + 16 + (j / 2) * 32;
      const int shift = (j % 2) * 4;
      for (int l = 0; l < kGroup; ++l) out.level[l] = (qs[l] >> shift) & 15;
      break;
    }
    default:
      TORCH_CHECK(false, "gguf_repack: ggml type ", type, " is not read here");
  }
}

void gguf_repack(const at::Tensor& raw, int64_t type, int64_t columns, const at::Tensor& levels,
                 const at::Tensor& steps, const c10::optional<at::Tensor>& minimums) {
  const bool int4 = minimums.has_value();
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.is_contiguous(),
              "gguf_repack: raw must be contiguous uint8 (rows, row bytes)");
  TORCH_CHECK(int4 == (type == kQ4_0 || type == kQ4_1 || type == kQ4_K),
              "gguf_repack: int4 buffers take Q4_0/Q4_1/Q4_K, int8 ones Q8_0/Q5_0");
  TORCH_CHECK(columns % kGroup == 0, "gguf_repack: columns must be a multiple of 32");
  const int64_t rows = raw.size(0), groups = columns / kGroup, blocks = (rows + kColumns - 1) / kColumns;
  const int64_t group_bytes = int4 ? 128 : 256;
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
          read_group(type, in + row * row_bytes, g, group);
          step_out[values + c] = group.step;
          if (int4) {
            minimum_out[values + c] = group.minimum;
            for (int v = 0; v < 4; ++v)  // vector v: inputs 4v..4v+3 low, 4(v+4).. high
              for (int i = 0; i < 4; ++i)
                dst[v * 32 + c * 4 + i] = group.level[4 * v + i] | (group.level[4 * (v + 4) + i] << 4);
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
