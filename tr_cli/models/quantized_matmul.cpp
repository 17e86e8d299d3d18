// tr's weight-quantized matmuls for x86-64 CPUs with AVX2 (built on first use: models/native_kernels.py).
//
// y = x Wᵀ with W holding GGUF's values: int4 as Q4_1 (groups of 32 inputs, a float16 step and minimum
// each), int5 as Q5_1 (the same with levels 0-31: GGUF's Q5 types as stored) or int8 as Q8_0 (groups
// of 32, a float16 step), rearranged in blocks of eight output columns.
// Each call quantizes the activations per row to int8 in groups of 32 (as Q8_1) and takes integer dot
// products (vpmaddubsw), so a row costs a few instructions per 32 weights and the rows of a call share
// each unpacked weight group: verifying a draft tree costs a fraction of a token per row.
//
// Every output is computed in one fixed order that depends on its row and column only, never on the
// other rows of the call or on the tiling: a row gives the same bits alone or among others, which is
// what makes tr's tree verification match one-token decoding exactly.
//
// Built with AVX512-VNNI (native_kernels.py turns it on where the CPU has it), the integer dot
// products are one vpdpbusd per four inputs instead of vpmaddubsw + vpmaddwd + vpaddd, the 32
// vector registers hold twice the rows per tile, and from a few rows on two blocks of columns share
// 512-bit registers (pair tiles). The integer sums are exact either way, so every build gives the
// same bits.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include "tr_kernels.h"
#include <algorithm>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__)
#include <sys/syscall.h>
#include <unistd.h>
#define TR_AMX 1
#else
#define TR_AMX 0
#endif

namespace {

constexpr int64_t kGroup = 32;
// How far ahead of the current weight group the next weights are fetched: the weights stream from
// memory once per call; without a prefetch a lone row waits on DRAM (3x slower on a 28 MB head).
constexpr int64_t kPrefetchBytes = 8192;
#define UNROLL _Pragma("GCC unroll 16")
// Rows per register tile; int8's by how many of its products add up in int16 (int8_tile): with all
// eight of a group's, no int32 sum stays live across the group and the 16 AVX2 registers hold 5 rows.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TR_VNNI 1
constexpr int kNibbleRows = 8;
template <int P>
constexpr int kInt8Rows = 6;
#else
#define TR_VNNI 0
// Int5 keeps a second, int32 sum a row (its products fill int16 in half a group): its registers
// spill at 4 rows, which still beat 3 (1.1-1.25x the multiply-adds a second from 4 rows on, one
// thread of a Xeon, weights in L2).
constexpr int kNibbleRows = 4;
template <int P>
constexpr int kInt8Rows = P == 8 ? 5 : 3;
#endif

struct Activations {
  const int8_t* a;       // (M, K)
  const float* d;        // (M, G): the step of each group
  const float* s;        // (M, G): d * sum(a) of each group
  const int32_t* minus;  // (M, G): -128 * sum(a) of each group (VNNI's int8 products: see int8_dots)
  int64_t K, G;
};

// x (M, K) float32 -> int8 levels with one step per 32 values (round to nearest even).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* a, float* d, float* s, int32_t* minus) {
  const int64_t G = K / kGroup;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * K + g * kGroup;
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      UNROLL for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xg + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      const float max = _mm_cvtss_f32(h);
      const float step = max / 127.0f;
      const __m256 inv = _mm256_set1_ps(max != 0.0f ? 127.0f / max : 0.0f);
      __m256i q[4];
      UNROLL for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_hadd_epi32(s4, s4);
      s4 = _mm_hadd_epi32(s4, s4);
      // int32 -> int16 -> int8, undoing the lane interleaving of the AVX2 packs.
      __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
      __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
      __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + m * K + g * kGroup), p8);
      d[m * G + g] = step;
      const int32_t total = _mm_cvtsi128_si32(s4);
      s[m * G + g] = step * static_cast<float>(total);
      minus[m * G + g] = -128 * total;
    }
  }
}


// The weights in blocks of eight output columns (models/weights.py packs them): per block of columns
// and group of 32 inputs, vector j (32 bytes) holds inputs 4j..4j+3 of each of the eight columns, so one
// vpmaddubsw multiplies four inputs of eight columns by the same four activations (one broadcast) and
// its lanes stay per column: no horizontal sums, one conversion and scaling per eight columns. On an
// AVX2 EPYC that halves the instructions per weight against a column at a time (1.6-2.2x, 1-32 rows).
//
// Int4: 128 bytes per (block, group); byte 4c+t of the i-th 32 bytes holds column c's level of input
// 4i+t (low nibble) and 4(i+4)+t (high nibble). Steps and minimums float16 (blocks, groups, 8).
// Int5 (GGUF's Q5 types as stored: levels 0-31, a step and a minimum): the same 128 bytes of low
// four bits, then 32 bytes of fifth bits, bit v of byte k being the fifth bit of byte k of nibble
// vector v (v = i: the i-th 32 bytes' low nibbles, v = i + 4: their high ones). 6 bits a weight
// against int8's 8.5: a lone row, which streams the weights from memory, reads 30 % fewer bytes.
template <bool kFive>
struct NibbleWeights {
  static constexpr int64_t kBytes = kFive ? 160 : 128;  // a (block, group)'s levels
  const uint8_t* q;
  const uint16_t* d;
  const uint16_t* mn;
  int64_t G;
};
using Int4Weights = NibbleWeights<false>;
using Int5Weights = NibbleWeights<true>;
template <class W>
constexpr bool kNibbles = std::is_same_v<W, Int4Weights> || std::is_same_v<W, Int5Weights>;

// Int8: 256 bytes per (block, group), byte 4c+t of the j-th 32 bytes = column c's level of input 4j+t;
// steps float16 (blocks, groups, 8).
struct Int8Weights {
  const int8_t* q;
  const uint16_t* d;
  int64_t G;
};

inline void prefetch_lines(const void* at, int lines) {
  for (int i = 0; i < lines; ++i) _mm_prefetch(static_cast<const char*>(at) + kPrefetchBytes + 64 * i, _MM_HINT_T0);
}

inline __m256i four_inputs(const int8_t* a) {
  int32_t v;
  std::memcpy(&v, a, 4);
  return _mm256_set1_epi32(v);
}

// Nibble vectors i and i + 4's fifth bits at bit 4 of each byte (the rest zero), from `shifted`: the
// fifth-bit plane shifted right by i in 16-bit lanes (bit i of a byte at its bit 0, bit i + 4 at its
// bit 4; no bit a 16-bit shift carries across bytes lands on bit 4 of either).
inline void fifth_bits(__m256i shifted, __m256i& low, __m256i& high) {
  const __m256i bit = _mm256_set1_epi8(0x10);
  low = _mm256_and_si256(_mm256_slli_epi16(shifted, 4), bit);
  high = _mm256_and_si256(shifted, bit);
}

// MR rows x one block of 8 columns. Per group, each row's eight products of 4 inputs x 8 columns add
// up in int16 (levels 0-15 times |a| <= 127: at most 16 * 1905 < 2^15, exact; int5's 0-31 over half a
// group: 8 * 3937 < 2^15), then to int32, float, times the two steps; the minimums' part (min_w d_x
// sum(a)) goes into the same sum.
template <int MR, bool kFive>
inline void int4_tile(const Activations& x, const NibbleWeights<kFive>& w, int64_t m0, int64_t b, int64_t N, float* out) {
  constexpr int64_t bytes = NibbleWeights<kFive>::kBytes;
  const __m256i low = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  UNROLL for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  const uint8_t* q = w.q + b * w.G * bytes;
  const uint16_t* d = w.d + b * w.G * 8;
  const uint16_t* mn = w.mn + b * w.G * 8;
  for (int64_t g = 0; g < w.G; ++g) {
    prefetch_lines(q + g * bytes, kFive ? 3 : 2);
    __m256i sum[MR];
    [[maybe_unused]] __m256i wide[MR];
#if TR_VNNI
    UNROLL for (int m = 0; m < MR; ++m) sum[m] = _mm256_setzero_si256();
#endif
    [[maybe_unused]] __m256i plane;
    if constexpr (kFive) plane = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * bytes + 128));
    UNROLL for (int i = 0; i < 4; ++i) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * bytes + 32 * i));
      __m256i lo = _mm256_and_si256(packed, low), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
      if constexpr (kFive) {
        __m256i lo5, hi5;
        fifth_bits(plane, lo5, hi5);
        lo = _mm256_or_si256(lo, lo5);
        hi = _mm256_or_si256(hi, hi5);
        plane = _mm256_srli_epi16(plane, 1);
      }
      UNROLL for (int m = 0; m < MR; ++m) {
        const int8_t* a = x.a + (m0 + m) * x.K + g * kGroup;
#if TR_VNNI
        sum[m] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(sum[m], lo, four_inputs(a + 4 * i)), hi,
                                     four_inputs(a + 4 * (i + 4)));
#else
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, four_inputs(a + 4 * i)),
                                           _mm256_maddubs_epi16(hi, four_inputs(a + 4 * (i + 4))));
        constexpr int kRun = kFive ? 2 : 4;  // products a row adds in int16 before widening
        sum[m] = i % kRun == 0 ? p : _mm256_add_epi16(sum[m], p);
        if constexpr (kFive) {
          if (i % kRun == kRun - 1) {
            const __m256i part = _mm256_madd_epi16(sum[m], ones);
            wide[m] = i == kRun - 1 ? part : _mm256_add_epi32(wide[m], part);
          }
        }
#endif
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + g * 8)));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + g * 8)));
    UNROLL for (int m = 0; m < MR; ++m) {
#if TR_VNNI
      const __m256 dots = _mm256_cvtepi32_ps(sum[m]);
#else
      const __m256 dots = _mm256_cvtepi32_ps(kFive ? wide[m] : _mm256_madd_epi16(sum[m], ones));
#endif
      const int64_t at = (m0 + m) * x.G + g;
      acc[m] = _mm256_fmadd_ps(dots, _mm256_mul_ps(dw, _mm256_broadcast_ss(x.d + at)), acc[m]);
      acc[m] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(x.s + at), acc[m]);
    }
  }
  UNROLL for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + (m0 + m) * N + b * 8, acc[m]);
}

// One group's integer dot products of rows m0.. with a block's eight columns (256 bytes of levels).
// Int8 levels reach 127, so a product pair can fill int16: in general each is widened to int32 at once.
// vpmaddubsw takes one unsigned operand: |w| against a with w's sign. Levels of fewer bits (GGUF's Q5_0
// is -16..15, Q6_K's near -32..31) leave room: P products of |w| <= 128 / P with |a| <= 127 add up in
// int16 exactly (P * 2 * 127 * 128 / P = 32512 < 2^15) before one widening, so a row costs one vpmaddwd
// per P vpmaddubsw instead of one each (on AVX2 EPYCs both run on one pipe: 1.3x the rows a second).
// The integer sums are the same for every P, so are the bits.
template <int MR, int P>
__attribute__((always_inline)) inline void int8_dots(const Activations& x, const int8_t* q, int64_t m0, int64_t g, __m256i* sum) {
#if TR_VNNI
  // vpdpbusd sums into int32 directly, its first operand unsigned: the levels go in as w + 128 (one
  // xor shared by the rows, no per-row sign fix) and each row's sum starts from -128 * sum(a), so it
  // ends at sum(w * a) exactly. Even and odd inputs in two sums: half the chain of dependent vpdpbusd.
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i odd[MR];
  UNROLL for (int m = 0; m < MR; ++m) {
    sum[m] = _mm256_set1_epi32(x.minus[(m0 + m) * x.G + g]);
    odd[m] = _mm256_setzero_si256();
  }
  UNROLL for (int j = 0; j < 8; ++j) {
    const __m256i shifted = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j)), flip);
    UNROLL for (int m = 0; m < MR; ++m) {
      const __m256i a = four_inputs(x.a + (m0 + m) * x.K + g * kGroup + 4 * j);
      if (j % 2) odd[m] = _mm256_dpbusd_epi32(odd[m], shifted, a);
      else sum[m] = _mm256_dpbusd_epi32(sum[m], shifted, a);
    }
  }
  UNROLL for (int m = 0; m < MR; ++m) sum[m] = _mm256_add_epi32(sum[m], odd[m]);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i part[MR];
  UNROLL for (int j = 0; j < 8; ++j) {
    const __m256i levels = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j));
    const __m256i magnitudes = _mm256_sign_epi8(levels, levels);
    UNROLL for (int m = 0; m < MR; ++m) {
      const __m256i a = _mm256_sign_epi8(four_inputs(x.a + (m0 + m) * x.K + g * kGroup + 4 * j), levels);
      const __m256i p = _mm256_maddubs_epi16(magnitudes, a);
      part[m] = j % P == 0 ? p : _mm256_add_epi16(part[m], p);
      if (j % P == P - 1) {
        const __m256i wide = _mm256_madd_epi16(part[m], ones);
        sum[m] = j == P - 1 ? wide : _mm256_add_epi32(sum[m], wide);
      }
    }
  }
#endif
}

template <int MR, int P>
inline void int8_tile(const Activations& x, const Int8Weights& w, int64_t m0, int64_t b, int64_t N, float* out) {
  __m256 acc[MR];
  UNROLL for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  const int8_t* q = w.q + b * w.G * 256;
  const uint16_t* d = w.d + b * w.G * 8;
  for (int64_t g = 0; g < w.G; ++g) {
    prefetch_lines(q + g * 256, 4);
    __m256i sum[MR];
    int8_dots<MR, P>(x, q + g * 256, m0, g, sum);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + g * 8)));
    UNROLL for (int m = 0; m < MR; ++m)
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_mul_ps(dw, _mm256_broadcast_ss(x.d + (m0 + m) * x.G + g)), acc[m]);
  }
  UNROLL for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + (m0 + m) * N + b * 8, acc[m]);
}

#if TR_VNNI
// A pair tile's prefetches: kPrefetchBytes ahead of its group in each block's own stream of weights,
// which goes on two blocks later (the next pair's), not into the pair's other block; into L2, not L1
// (with L1, 2-8 rows ran at half the speed on a Zen 4: benchmarks/kernel_rows.py).
class PairAhead {
 public:
  PairAhead(int64_t block_bytes, int64_t group_bytes)
      : block_(block_bytes), group_(group_bytes), offset_(kPrefetchBytes % block_bytes),
        skip_(2 * block_bytes * (kPrefetchBytes / block_bytes)) {}
  // The group after next's lines of both blocks, then on to the next group.
  void fetch(const void* first, const void* second) {
    for (const void* block : {first, second}) {
      const char* at = static_cast<const char*>(block) + skip_ + offset_;
      for (int64_t i = 0; i < group_; i += 64) _mm_prefetch(at + i, _MM_HINT_T1);
    }
    offset_ += group_;
    if (offset_ >= block_) offset_ -= block_, skip_ += 2 * block_;
  }

 private:
  int64_t block_, group_, offset_, skip_;
};

// Rows per tile of the pair tiles: a row holds a sum and an accumulator (two of the 32 registers).
constexpr int kPairRows = 12;

// 32 bytes of each block as one 512-bit register, block b's first.
inline __m512i pair_bytes(const void* first, const void* second) {
  const __m256i low = _mm256_loadu_si256(static_cast<const __m256i*>(first));
  const __m256i high = _mm256_loadu_si256(static_cast<const __m256i*>(second));
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

// Eight float16 of each block (its steps or minimums of one group) as 16 floats, block b's first.
inline __m512 pair_halves(const uint16_t* first, const uint16_t* second) {
  const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first));
  const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(second));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1));
}

// Several rows on AVX-512: blocks b and b+1 side by side in 512-bit registers, so a row's broadcast of
// four activations serves 16 columns, and a tile of up to 12 rows reads each weight once (on a Zen 4,
// one thread, the 0.5B's shapes: int8 at 8 rows 1.4-1.8x, int4 1.2x the multiply-adds a second of
// the one-block tiles). Lane for lane the operations of int8_tile (the same integer sums, then
// acc += dots * (d_w * d_x)): the same bits.
template <int MR>
inline void int8_pair_tile(const Activations& x, const Int8Weights& w, int64_t m0, int64_t b, int64_t N, float* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MR];
  UNROLL for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  const int8_t* q0 = w.q + b * w.G * 256;
  const int8_t* q1 = q0 + w.G * 256;
  const uint16_t* d0 = w.d + b * w.G * 8;
  const uint16_t* d1 = d0 + w.G * 8;
  PairAhead ahead(w.G * 256, 256);
  for (int64_t g = 0; g < w.G; ++g) {
    ahead.fetch(q0, q1);
    __m512i sum[MR];
    UNROLL for (int m = 0; m < MR; ++m) sum[m] = _mm512_set1_epi32(x.minus[(m0 + m) * x.G + g]);
    UNROLL for (int j = 0; j < 8; ++j) {
      const __m512i shifted = _mm512_xor_si512(pair_bytes(q0 + g * 256 + 32 * j, q1 + g * 256 + 32 * j), flip);
      UNROLL for (int m = 0; m < MR; ++m) {
        int32_t four;
        std::memcpy(&four, x.a + (m0 + m) * x.K + g * kGroup + 4 * j, 4);
        sum[m] = _mm512_dpbusd_epi32(sum[m], shifted, _mm512_set1_epi32(four));
      }
    }
    const __m512 dw = pair_halves(d0 + g * 8, d1 + g * 8);
    UNROLL for (int m = 0; m < MR; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(m0 + m) * x.G + g])), acc[m]);
  }
  UNROLL for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + (m0 + m) * N + b * 8, acc[m]);
}

// Int4's and int5's pair of blocks: each 32 bytes of a block unpacked once for the tile's rows, as in
// int4_tile.
template <int MR, bool kFive>
inline void int4_pair_tile(const Activations& x, const NibbleWeights<kFive>& w, int64_t m0, int64_t b, int64_t N,
                           float* out) {
  constexpr int64_t bytes = NibbleWeights<kFive>::kBytes;
  const __m512i low = _mm512_set1_epi8(0x0F);
  [[maybe_unused]] const __m512i bit = _mm512_set1_epi8(0x10);
  __m512 acc[MR];
  UNROLL for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  const uint8_t* q0 = w.q + b * w.G * bytes;
  const uint8_t* q1 = q0 + w.G * bytes;
  const uint16_t* d = w.d + b * w.G * 8;
  const uint16_t* mn = w.mn + b * w.G * 8;
  const int64_t next = w.G * 8;  // from block b's steps and minimums to block b+1's
  PairAhead ahead(w.G * bytes, bytes);
  for (int64_t g = 0; g < w.G; ++g) {
    ahead.fetch(q0, q1);
    __m512i sum[MR];
    UNROLL for (int m = 0; m < MR; ++m) sum[m] = _mm512_setzero_si512();
    [[maybe_unused]] __m512i plane;
    if constexpr (kFive) plane = pair_bytes(q0 + g * bytes + 128, q1 + g * bytes + 128);
    UNROLL for (int i = 0; i < 4; ++i) {
      const __m512i packed = pair_bytes(q0 + g * bytes + 32 * i, q1 + g * bytes + 32 * i);
      __m512i lo = _mm512_and_si512(packed, low), hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      if constexpr (kFive) {  // 16 added where the byte's fifth bit (bit i / i + 4 of the plane) is set
        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(plane, _mm512_set1_epi8(1 << i)), lo, bit);
        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(plane, _mm512_set1_epi8(1 << (i + 4))), hi, bit);
      }
      UNROLL for (int m = 0; m < MR; ++m) {
        const int8_t* a = x.a + (m0 + m) * x.K + g * kGroup;
        int32_t four_lo, four_hi;
        std::memcpy(&four_lo, a + 4 * i, 4);
        std::memcpy(&four_hi, a + 4 * (i + 4), 4);
        sum[m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[m], lo, _mm512_set1_epi32(four_lo)), hi, _mm512_set1_epi32(four_hi));
      }
    }
    const __m512 dw = pair_halves(d + g * 8, d + next + g * 8), mw = pair_halves(mn + g * 8, mn + next + g * 8);
    UNROLL for (int m = 0; m < MR; ++m) {
      const int64_t at = (m0 + m) * x.G + g;
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at])), acc[m]);
      acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[at]), acc[m]);
    }
  }
  UNROLL for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + (m0 + m) * N + b * 8, acc[m]);
}

// From how many rows the pairs of blocks take over: below, the weights' two streams from memory cost
// more than the broadcasts they save (int8's, at twice int4's bytes, up to 3 rows on the 0.5B's head).
template <class W>
constexpr int64_t kPairFromRows = kNibbles<W> ? 2 : 4;
#endif

// How many products of block b's levels add up exactly in int16 (8, 4, 2 or 1: see int8_tile), from
// its widest level; a block of full-width levels (Q8_0's reach 127 in nearly every group) is known
// after its first group. Read once per call for all the row tiles (from about 3 % of their work).
inline int int16_products(const Int8Weights& w, int64_t b) {
  const int8_t* q = w.q + b * w.G * 256;
  const __m256i limits[3] = {_mm256_set1_epi8(16), _mm256_set1_epi8(32), _mm256_set1_epi8(64)};
  // min(top, limit) == top in every byte: no magnitude above the limit (unsigned: -128's is 128).
  auto within = [](__m256i top, __m256i limit) { return _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(top, limit), top)) == -1; };
  __m256i top = _mm256_setzero_si256();
  for (int64_t g = 0; g < w.G; ++g) {
    UNROLL for (int j = 0; j < 8; ++j) {
      const __m256i levels = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 256 + 32 * j));
      top = _mm256_max_epu8(top, _mm256_sign_epi8(levels, levels));
    }
    if (!within(top, limits[2])) return 1;
  }
  return within(top, limits[0]) ? 8 : within(top, limits[1]) ? 4 : 2;
}

// The last rows of a call, fewer than a full tile: one tile of exactly that many.
template <int R, class Tile>
inline void rest_rows(int64_t left, int64_t m, Tile&& tile) {
  if constexpr (R > 0) {
    if (left == R) return tile(std::integral_constant<int, R>{}, m);
    rest_rows<R - 1>(left, m, tile);
  }
}

// All rows for one block of columns, MR rows at a time (the weights of the block stay in L1 across
// row tiles). More rows for int4 than for int8 (its widened sums need more registers), twice as many
// with AVX-512's 32 registers; a tile of fewer rows computes each of its rows exactly as a full one does.
template <int MR, class Tile>
inline void block_rows(int64_t M, Tile&& tile) {
  int64_t m = 0;
  for (; m + MR <= M; m += MR) tile(std::integral_constant<int, MR>{}, m);
  rest_rows<MR - 1>(M - m, m, tile);
}

// The same in tiles of nearly equal size (16 rows as 8 + 8, not 12 + 4: a small last tile wastes
// the pass over the weights it shares).
template <int MR, class Tile>
inline void even_rows(int64_t M, Tile&& tile) {
  const int64_t tiles = (M + MR - 1) / MR;
  for (int64_t t = 0, m = 0; t < tiles; ++t) {
    const int64_t rows = M / tiles + (t < M % tiles);
    rest_rows<MR>(rows, m, tile);
    m += rows;
  }
}

#if TR_AMX
// AMX (Sapphire Rapids and later): per weight group, one tile instruction takes up to 16 rows' 32
// activations times 8 columns' 32 levels into exact int32 sums (tdpbssd for int8, tdpbsud for int4's
// unsigned levels): the block's weights are read (int4: unpacked) once for all rows, and a row costs
// only its group's float scaling, lane for lane the AVX2 build's operations in its order
// (acc += dots * (d_w * d_x), then int4's min_w * s_x), so every build gives the same bits.
// Two column blocks at a time fill a 16-float register; groups alternate between two sets of tiles.

// Linux hands out the 8 KB of tile state only on request, once per process; refused (an old
// kernel, a VM that hides it), the VNNI code of the same build runs.
bool tiles_permitted() {
  static const bool permitted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return permitted;
}

constexpr int kTileRows = 16;

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Int4: two sets of tiles, for even and odd groups (consecutive products need not wait for each
// other): sums 0 / 3 (rows x 16 int32), activations 1 / 4 (rows x 32), unpacked levels 2 / 5 (8 x 64
// bytes). Int8 reads its levels straight from the weights, a block (8 columns) a tile: sums 0 and 1
// (rows x 8 int32, blocks b and b+1), then activations and the two blocks' levels 2-4 / 5-7 (8 x 32).
template <bool kInt4>
void configure_tiles(int rows) {
  TileConfig c;
  if constexpr (kInt4) {
    for (int t : {0, 3}) c.rows[t] = rows, c.colsb[t] = 64;
    for (int t : {1, 4}) c.rows[t] = rows, c.colsb[t] = kGroup;
    for (int t : {2, 5}) c.rows[t] = 8, c.colsb[t] = 64;
  } else {
    for (int t : {0, 1, 2, 5}) c.rows[t] = rows, c.colsb[t] = 32;
    for (int t : {3, 4, 6, 7}) c.rows[t] = 8, c.colsb[t] = 32;
  }
  // Not _tile_loadconfig: GCC 12 does not see that it reads the whole struct and drops the stores.
  asm volatile("ldtilecfg %0" ::"m"(c));
}

// One group's int4 levels of blocks b and b+1 unpacked as one tile of 8 rows (4 inputs each) x 16
// columns, block b's 8 columns first (vector i of a block's packed 128 bytes holds inputs 4i..4i+3 in
// its low nibbles, 4(i+4).. in its high ones). A lone last block fills both halves.
__attribute__((always_inline)) inline void unpack_pair(const uint8_t* first, const uint8_t* second, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 2; ++k) {
    const __m512i a = _mm512_loadu_si512(first + 64 * k), b = _mm512_loadu_si512(second + 64 * k);
    const __m512i rows[2] = {_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE)};
    for (int r = 0; r < 2; ++r) {
      _mm512_store_si512(out + 64 * (2 * k + r), _mm512_and_si512(rows[r], low));
      _mm512_store_si512(out + 64 * (2 * k + r + 4), _mm512_and_si512(_mm512_srli_epi16(rows[r], 4), low));
    }
  }
}

template <bool kInt4>
struct TileWeights {
  const void* q;  // int8 (blocks, G, 256) or int4 (blocks, G, 128)
  const uint16_t* d;
  const uint16_t* mn;  // int4 only
  int64_t G;
};

// The tile instructions name their tiles by number in the instruction itself (macros that paste
// the number): one copy of a group's tile work per set of tiles. Int4 from its unpacked levels:
#define TR_INT4_TILES(I, C, A, B)                                                  \
  _tile_loadd(A, x.a + m0 * x.K + (g0 + (I)) * kGroup, x.K);                      \
  _tile_loadd(B, levels[I], 64);                                                   \
  _tile_zero(C);                                                                   \
  _tile_dpbsud(C, A, B);                                                           \
  _tile_stored(C, sums[I], 64);
// Int8 from the weights themselves: a block's group is its tile of levels as packed (8 x 32 bytes),
// each block's sums into its half of the row's 16 int32 (a lone last block: both halves its own).
#define TR_INT8_TILES(I, A, B0, B1)                                                 \
  ahead.fetch(first + (g0 + (I)) * bytes, second + (g0 + (I)) * bytes);             \
  _tile_loadd(A, x.a + m0 * x.K + (g0 + (I)) * kGroup, x.K);                       \
  _tile_loadd(B0, first + (g0 + (I)) * bytes, 32);                                  \
  _tile_loadd(B1, second + (g0 + (I)) * bytes, 32);                                 \
  _tile_zero(0);                                                                    \
  _tile_zero(1);                                                                    \
  _tile_dpbssd(0, A, B0);                                                           \
  _tile_dpbssd(1, A, B1);                                                           \
  _tile_stored(0, sums[I], 64);                                                     \
  _tile_stored(1, sums[I] + 8, 64);

// Groups per run of tile_rows' phases. A tile load waits for the vector stores before it (int4's
// unpacked levels) and the scaling's vector loads for the tile stores of the sums: group by group
// those waits were in series (at 8 rows the tiles ran at half the VNNI pair tiles' speed). In runs,
// a run's levels are all laid out before its first tile load, its sums all stored before the first
// is scaled. 16 groups: 8 KB of levels and 16 KB of sums (16 rows), within L1.
constexpr int64_t kTileRun = 16;

// Rows m0..m0+MR of blocks b..b+NB-1 (b twice for a lone block): run by run, int4's levels
// unpacked, the groups' integer sums from the tiles (even and odd groups on two sets of
// tiles, so that consecutive products need not wait for each other), then scaled in registers in
// group order.
template <bool kInt4, int NB, int MR>
void tile_rows(const Activations& x, const TileWeights<kInt4>& w, int64_t m0, int64_t b, int64_t N, float* out) {
  constexpr int64_t bytes = kInt4 ? 128 : 256;
  alignas(64) int32_t sums[kTileRun][kTileRows * 16];  // the tiles' rows, which may be more than MR
  const __mmask16 lanes = NB == 2 ? 0xFFFF : 0x00FF;
  __m512 acc[MR];
  UNROLL for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  // Inlined, or the accumulators (caller-saved registers) would go to memory around each call.
  auto scale = [&](int64_t g, const int32_t* s) __attribute__((always_inline)) {
    const __m512 dw = pair_halves(w.d + (b * w.G + g) * 8, w.d + ((b + NB - 1) * w.G + g) * 8);
    [[maybe_unused]] __m512 mw;
    if constexpr (kInt4) mw = pair_halves(w.mn + (b * w.G + g) * 8, w.mn + ((b + NB - 1) * w.G + g) * 8);
    UNROLL for (int m = 0; m < MR; ++m) {
      const int64_t at = (m0 + m) * x.G + g;
      const __m512 dots = _mm512_cvtepi32_ps(_mm512_load_si512(s + 16 * m));
      acc[m] = _mm512_fmadd_ps(dots, _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at])), acc[m]);
      if constexpr (kInt4) acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[at]), acc[m]);
    }
  };
  const uint8_t* first = static_cast<const uint8_t*>(w.q) + b * w.G * bytes;
  const uint8_t* second = first + (NB - 1) * w.G * bytes;
  PairAhead ahead(w.G * bytes, bytes);
  for (int64_t g0 = 0; g0 < w.G; g0 += kTileRun) {
    const int64_t run = std::min(kTileRun, w.G - g0);
    int64_t i = 0;
    if constexpr (kInt4) {
      alignas(64) uint8_t levels[kTileRun][512];  // the run's unpacked levels
      for (; i < run; ++i) {
        ahead.fetch(first + (g0 + i) * bytes, second + (g0 + i) * bytes);
        unpack_pair(first + (g0 + i) * bytes, second + (g0 + i) * bytes, levels[i]);
      }
      for (i = 0; i + 2 <= run; i += 2) {
        TR_INT4_TILES(i, 0, 1, 2)
        TR_INT4_TILES(i + 1, 3, 4, 5)
      }
      if (i < run) {
        TR_INT4_TILES(i, 0, 1, 2)
      }
    } else {
      for (; i + 2 <= run; i += 2) {
        TR_INT8_TILES(i, 2, 3, 4)
        TR_INT8_TILES(i + 1, 5, 6, 7)
      }
      if (i < run) {
        TR_INT8_TILES(i, 2, 3, 4)
      }
    }
    for (int64_t j = 0; j < run; ++j) scale(g0 + j, sums[j]);
  }
  UNROLL for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(out + (m0 + m) * N + b * 8, lanes, acc[m]);
}

template <bool kInt4, int NB>
void tile_rows_any(int64_t rows, const Activations& x, const TileWeights<kInt4>& w, int64_t m0, int64_t b, int64_t N,
                   float* out) {
  rest_rows<kTileRows>(rows, m0, [&](auto r, int64_t m) { tile_rows<kInt4, NB, decltype(r)::value>(x, w, m, b, N, out); });
}

// All rows of a call through the tiles, 16 at a time (the activations padded to a multiple of 16
// rows when there are more, so every tile reads whole rows: the padding's sums are not used).
template <bool kInt4>
void tile_matmul(const Activations& x, const TileWeights<kInt4>& w, int64_t M, int64_t N, float* out) {
  const int64_t blocks = N / 8, pairs = (blocks + 1) / 2;
  at::parallel_for(0, pairs, 2, [&](int64_t begin, int64_t end) {
    configure_tiles<kInt4>(static_cast<int>(std::min<int64_t>(M, kTileRows)));
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = 2 * p;
      for (int64_t m = 0; m < M; m += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, M - m);
        if (b + 1 < blocks) tile_rows_any<kInt4, 2>(rows, x, w, m, b, N, out);
        else tile_rows_any<kInt4, 1>(rows, x, w, m, b, N, out);
      }
    }
    _tile_release();
  });
}

// From how many rows the tiles take over. A tile product costs 16 cycles whatever its shape, and
// groups of 32 inputs fill half its depth (int8: also half its width): on a 2-core Xeon with AMX
// (benchmarks/kernel_rows.py, one thread, the 0.5B's shapes) tiles gave 0.6-0.7x the VNNI pair
// tiles' multiply-adds a second at 8 rows, 0.9-1.1x at 12, 1.1-1.3x at 16 and 1.0-1.5x at 32.
constexpr int64_t kTileFromRows = 16;
#endif

// Block b's rows on int8 weights, products summed in int16 as far as its levels allow (int8_tile);
// a lone row streams the weights from memory and gains nothing from a second pass over them.
inline void int8_block(const Activations& a, const Int8Weights& w, int64_t M, int64_t b, int64_t N, float* o) {
  auto rows_with = [&](auto products) {
    constexpr int P = decltype(products)::value;
    block_rows<kInt8Rows<P>>(M, [&](auto rows, int64_t m) { int8_tile<decltype(rows)::value, P>(a, w, m, b, N, o); });
  };
#if TR_VNNI
  rows_with(std::integral_constant<int, 1>{});
#else
  switch (M < 2 ? 1 : int16_products(w, b)) {
    case 8: return rows_with(std::integral_constant<int, 8>{});
    case 4: return rows_with(std::integral_constant<int, 4>{});
    case 2: return rows_with(std::integral_constant<int, 2>{});
    default: return rows_with(std::integral_constant<int, 1>{});
  }
#endif
}

// Block b's rows with one block of columns per tile (int4's row tiles, int8_block).
template <bool kFive>
inline void one_block(const Activations& a, const NibbleWeights<kFive>& w, int64_t M, int64_t b, int64_t N, float* o) {
  block_rows<kNibbleRows>(M, [&](auto rows, int64_t m) { int4_tile<decltype(rows)::value>(a, w, m, b, N, o); });
}
inline void one_block(const Activations& a, const Int8Weights& w, int64_t M, int64_t b, int64_t N, float* o) {
  int8_block(a, w, M, b, N, o);
}

template <class W>
at::Tensor matmul(const at::Tensor& x, const W& w, int64_t N) {
  const int64_t M = x.size(0), K = x.size(1), G = w.G;
#if TR_AMX
  // Int5 stays on the pair tiles (the tiles unpack nibbles only).
  const bool tiles = !std::is_same_v<W, Int5Weights> && M >= kTileFromRows && tiles_permitted();
  const int64_t padded = tiles && M > kTileRows ? (M + kTileRows - 1) / kTileRows * kTileRows : M;
#else
  const int64_t padded = M;
#endif
  at::Tensor levels = at::empty({padded, K}, x.options().dtype(at::kChar));
  // Steps, their sums and the int32 -128 * sum(a) in one allocation (its third plane holds int32).
  at::Tensor steps = at::empty({3, M, G}, x.options());
  float* d = steps.data_ptr<float>();
  int32_t* minus = reinterpret_cast<int32_t*>(d + 2 * M * G);
  quantize_rows(x.data_ptr<float>(), M, K, levels.data_ptr<int8_t>(), d, d + M * G, minus);
  const Activations a{levels.data_ptr<int8_t>(), d, d + M * G, minus, K, G};
  at::Tensor out = at::empty({M, N}, x.options());
  float* o = out.data_ptr<float>();
#if TR_AMX
  if (tiles) {
    if constexpr (std::is_same_v<W, Int4Weights>)
      tile_matmul<true>(a, TileWeights<true>{w.q, w.d, w.mn, G}, M, N, o);
    else if constexpr (std::is_same_v<W, Int8Weights>)
      tile_matmul<false>(a, TileWeights<false>{w.q, w.d, nullptr, G}, M, N, o);
    return out;
  }
#endif
#if TR_VNNI
  if (M >= kPairFromRows<W>) {
    const int64_t blocks = N / 8;
    at::parallel_for(0, blocks / 2, 2, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        even_rows<kPairRows>(M, [&](auto rows, int64_t m) {
          if constexpr (kNibbles<W>) int4_pair_tile<decltype(rows)::value>(a, w, m, 2 * p, N, o);
          else int8_pair_tile<decltype(rows)::value>(a, w, m, 2 * p, N, o);
        });
    });
    if (blocks % 2) one_block(a, w, M, blocks - 1, N, o);
    return out;
  }
#endif
  at::parallel_for(0, N / 8, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) one_block(a, w, M, b, N, o);
  });
  return out;
}


// The operands as the Python side packs them (models/weights.py); anything else is refused, never read past.
void check(const at::Tensor& x, const at::Tensor& q, int64_t bytes, at::ScalarType levels, const at::Tensor& d) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat, "x: float32 (..., inputs)");
  TORCH_CHECK(x.size(-1) % kGroup == 0, "x: inputs a multiple of 32, got ", x.size(-1));
  const int64_t G = x.size(-1) / kGroup;
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == levels && q.is_contiguous() && q.size(1) == G && q.size(2) == bytes,
              "q: contiguous (outputs / 8, ", G, ", ", bytes, ") levels");
  TORCH_CHECK(d.dim() == 3 && d.scalar_type() == at::kHalf && d.is_contiguous() && d.size(0) == q.size(0) &&
                  d.size(1) == G && d.size(2) == 8,
              "steps: contiguous (outputs / 8, ", G, ", 8) float16");
}

// x (..., K) -> (..., N): the rows flattened for the kernel, the bias (if any) added after.
template <class W>
at::Tensor linear(const at::Tensor& x, const W& w, int64_t N, const c10::optional<at::Tensor>& bias) {
  const at::Tensor flat = x.contiguous().view({-1, x.size(-1)});
  at::Tensor out = matmul(flat, w, N);
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return out.view(shape);
}

template <bool kFive>
at::Tensor nibble_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& mn,
                     const c10::optional<at::Tensor>& bias) {
  check(x, q, NibbleWeights<kFive>::kBytes, at::kByte, d);
  TORCH_CHECK(mn.sizes() == d.sizes() && mn.scalar_type() == at::kHalf && mn.is_contiguous(), "minimums: as the steps");
  const NibbleWeights<kFive> w{q.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()),
                               reinterpret_cast<const uint16_t*>(mn.data_ptr<at::Half>()), x.size(-1) / kGroup};
  return linear(x, w, 8 * q.size(0), bias);
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& mn,
                   const c10::optional<at::Tensor>& bias) {
  return nibble_mm<false>(x, q, d, mn, bias);
}

at::Tensor int5_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& mn,
                   const c10::optional<at::Tensor>& bias) {
  return nibble_mm<true>(x, q, d, mn, bias);
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const c10::optional<at::Tensor>& bias) {
  check(x, q, 256, at::kChar, d);
  const Int8Weights w{q.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()), x.size(-1) / kGroup};
  return linear(x, w, 8 * q.size(0), bias);
}

}  // namespace

at::Tensor tr::quantized_linear(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps,
                                const c10::optional<at::Tensor>& minimums, const c10::optional<at::Tensor>& bias) {
  if (levels.scalar_type() == at::kByte) {
    TORCH_CHECK(minimums.has_value() && minimums->defined(), "int4/int5 weights need their minimums");
    if (levels.dim() == 3 && levels.size(2) == Int5Weights::kBytes) return int5_mm(x, levels, steps, *minimums, bias);
    return int4_mm(x, levels, steps, *minimums, bias);
  }
  return int8_mm(x, levels, steps, bias);
}

// From how many rows this build's matmuls go through AMX tiles here; 0: never (no AMX build, or
// the OS did not grant the tiles).
int64_t tile_from_rows() {
#if TR_AMX
  return tiles_permitted() ? kTileFromRows : 0;
#else
  return 0;
#endif
}

TORCH_LIBRARY(tr_kernels, m) {
  m.def("tile_from_rows() -> int");
  m.def("int4_mm(Tensor x, Tensor q, Tensor d, Tensor mn, Tensor? bias=None) -> Tensor");
  m.def("int5_mm(Tensor x, Tensor q, Tensor d, Tensor mn, Tensor? bias=None) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor q, Tensor d, Tensor? bias=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int5_mm", &int5_mm);
  m.impl("int8_mm", &int8_mm);
}
TORCH_LIBRARY_IMPL(tr_kernels, CatchAll, m) { m.impl("tile_from_rows", &tile_from_rows); }
