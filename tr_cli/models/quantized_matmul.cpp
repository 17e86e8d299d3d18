// tr's weight-quantized matmuls for x86-64 CPUs with AVX2 (built on first use: models/native_kernels.py).
//
// y = x Wᵀ with W held as GGUF holds it: int4 as Q4_1 (groups of 32 inputs, a float16 step and minimum
// each) or int8 as Q8_0 (groups of 32, a float16 step). Each call quantizes the activations per row to
// int8 in groups of 32 (as Q8_1) and takes integer dot products (vpmaddubsw), so a row costs a few
// instructions per 32 weights and the rows of a call share each unpacked weight group: verifying a
// draft tree costs little more than one token.
//
// Every output is computed in one fixed order that depends on its row and column only, never on the
// other rows of the call or on the tiling: a row gives the same bits alone or among others, which is
// what makes tr's tree verification match one-token decoding exactly.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include "tr_kernels.h"
#include <algorithm>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
// How far ahead of the current weight group the next weights are fetched: the weights stream from
// memory once per call; without a prefetch a lone row waits on DRAM (3x slower on a 28 MB head).
constexpr int64_t kPrefetchBytes = 8192;
#define UNROLL _Pragma("GCC unroll 16")

struct Activations {
  const int8_t* a;    // (M, K)
  const float* d;     // (M, G): the step of each group
  const float* s;     // (M, G): d * sum(a) of each group
  int64_t K, GP;
};

// x (M, K) float32 -> int8 levels with one step per 32 values (round to nearest even).
void quantize_rows(const float* x, int64_t M, int64_t K, int64_t GP, int8_t* a, float* d, float* s) {
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
      d[m * GP + g] = step;
      s[m * GP + g] = step * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
  }
}


// Int4 weights: column n, group g: 16 bytes, byte i = level of k=i (low nibble) and k=i+16 (high);
// steps and minimums as float16 (N, G).
struct Int4Weights {
  static constexpr bool kMin = true;
  const uint8_t* q;
  const uint16_t* d;
  const uint16_t* mn;
  int64_t G, GP;  // groups, and groups padded to a multiple of 8 (the steps' row length)
  // Levels (unsigned) for maddubs; `signs` unused.
  inline void prefetch(int64_t n, int64_t g) const { _mm_prefetch(reinterpret_cast<const char*>(q + (n * G + g) * 16) + kPrefetchBytes, _MM_HINT_T0); }
  inline __m256i levels(int64_t n, int64_t g, __m256i& signs) const {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + (n * G + g) * 16));
    const __m128i low = _mm_set1_epi8(0x0F);
    signs = _mm256_setzero_si256();
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
  }
  static inline __m256i activations(__m256i a, __m256i) { return a; }
};

// Int8 weights: column n, group g: 32 signed levels; steps as float16 (N, G). maddubs takes one
// unsigned operand: |w| against a with w's sign.
struct Int8Weights {
  static constexpr bool kMin = false;
  const int8_t* q;
  const uint16_t* d;
  const uint16_t* mn;
  int64_t G, GP;
  inline void prefetch(int64_t n, int64_t g) const { _mm_prefetch(reinterpret_cast<const char*>(q + (n * G + g) * 32) + kPrefetchBytes, _MM_HINT_T0); }
  inline __m256i levels(int64_t n, int64_t g, __m256i& signs) const {
    signs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (n * G + g) * 32));
    return _mm256_sign_epi8(signs, signs);
  }
  static inline __m256i activations(__m256i a, __m256i signs) { return _mm256_sign_epi8(a, signs); }
};

template <class W, int MR, int NC>
inline void tile(const Activations& x, const W& w, int64_t m0, int64_t n0, int64_t N, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NC];
  UNROLL for (int m = 0; m < MR; ++m) UNROLL for (int c = 0; c < NC; ++c) acc[m][c] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < w.G; g0 += 8) {
    // Eight groups' combined steps d_w * d_x per (row, column), ahead of the integer work.
    alignas(32) float scale[MR][NC][8];
    UNROLL for (int c = 0; c < NC; ++c) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + (n0 + c) * w.GP + g0)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (W::kMin) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mn + (n0 + c) * w.GP + g0)));
      UNROLL for (int m = 0; m < MR; ++m) {
        _mm256_store_ps(scale[m][c], _mm256_mul_ps(dw, _mm256_loadu_ps(x.d + (m0 + m) * x.GP + g0)));
        if constexpr (W::kMin)
          // The minimums' part (min_w d_x sum(a) of eight groups) goes into the same sum: one sum per output.
          acc[m][c] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x.s + (m0 + m) * x.GP + g0), acc[m][c]);
      }
    }
    const int64_t g1 = std::min<int64_t>(g0 + 8, w.G);
    for (int64_t g = g0; g < g1; ++g) {
      __m256i lv[NC], sg[NC];
      UNROLL for (int c = 0; c < NC; ++c) {
        w.prefetch(n0 + c, g);
        lv[c] = w.levels(n0 + c, g, sg[c]);
      }
      UNROLL for (int m = 0; m < MR; ++m) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.a + (m0 + m) * x.K + g * kGroup));
        UNROLL for (int c = 0; c < NC; ++c) {
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(lv[c], W::activations(a, sg[c])), ones);
          acc[m][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&scale[m][c][g - g0]), acc[m][c]);
        }
      }
    }
  }
  UNROLL for (int m = 0; m < MR; ++m) UNROLL for (int c = 0; c < NC; ++c)
    out[(m0 + m) * N + n0 + c] = tr::hsum(acc[m][c]);
}

template <class W, int NC>
inline void column_tile(const Activations& x, const W& w, int64_t M, int64_t n0, int64_t N, float* out) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) tile<W, 6, NC>(x, w, m, n0, N, out);
  switch (M - m) {
    case 5: tile<W, 5, NC>(x, w, m, n0, N, out); break;
    case 4: tile<W, 4, NC>(x, w, m, n0, N, out); break;
    case 3: tile<W, 3, NC>(x, w, m, n0, N, out); break;
    case 2: tile<W, 2, NC>(x, w, m, n0, N, out); break;
    case 1: tile<W, 1, NC>(x, w, m, n0, N, out); break;
    default: break;
  }
}

template <class W>
at::Tensor matmul(const at::Tensor& x, const W& w, int64_t N) {
  const int64_t M = x.size(0), K = x.size(1), GP = w.GP;
  at::Tensor levels = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor steps = at::zeros({2, M, GP}, x.options());  // padded groups stay 0
  float* d = steps.data_ptr<float>();
  quantize_rows(x.data_ptr<float>(), M, K, GP, levels.data_ptr<int8_t>(), d, d + M * GP);
  const Activations a{levels.data_ptr<int8_t>(), d, d + M * GP, K, GP};
  at::Tensor out = at::empty({M, N}, x.options());
  float* o = out.data_ptr<float>();
  // One row: four columns at a time keep four independent sums going; more rows share each
  // column's unpacked levels across blocks of six rows (12 % faster than four over 64 rows, a prompt's
  // chunk, on an AVX2 EPYC; the order of each output's sum does not depend on the blocking).
  const int64_t NC = M == 1 ? 4 : 2;
  const int64_t tiles = N / NC;
  at::parallel_for(0, tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (M == 1) tile<W, 1, 4>(a, w, 0, t * 4, N, o);
      else column_tile<W, 2>(a, w, M, t * 2, N, o);
    }
  });
  for (int64_t n = tiles * NC; n < N; ++n) column_tile<W, 1>(a, w, M, n, N, o);
  return out;
}

// The operands as the Python side packs them (models/weights.py); anything else is refused, never read past.
void check(const at::Tensor& x, const at::Tensor& q, int64_t bytes, at::ScalarType levels, const at::Tensor& d) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat, "x: float32 (..., inputs)");
  TORCH_CHECK(x.size(-1) % kGroup == 0, "x: inputs a multiple of 32, got ", x.size(-1));
  const int64_t G = x.size(-1) / kGroup;
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == levels && q.is_contiguous() && q.size(1) == G && q.size(2) == bytes,
              "q: contiguous (outputs, ", G, ", ", bytes, ") levels");
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == at::kHalf && d.is_contiguous() && d.size(0) == q.size(0) &&
                  d.size(1) >= G && d.size(1) % 8 == 0,
              "steps: contiguous (outputs, groups padded to 8) float16");
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

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& mn,
                   const c10::optional<at::Tensor>& bias) {
  check(x, q, 16, at::kByte, d);
  TORCH_CHECK(mn.sizes() == d.sizes() && mn.scalar_type() == at::kHalf && mn.is_contiguous(), "minimums: as the steps");
  const Int4Weights w{q.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()),
                      reinterpret_cast<const uint16_t*>(mn.data_ptr<at::Half>()), x.size(-1) / kGroup, d.size(1)};
  return linear(x, w, q.size(0), bias);
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const c10::optional<at::Tensor>& bias) {
  check(x, q, 32, at::kChar, d);
  const Int8Weights w{q.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()), nullptr,
                      x.size(-1) / kGroup, d.size(1)};
  return linear(x, w, q.size(0), bias);
}

}  // namespace

at::Tensor tr::quantized_linear(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps,
                                const c10::optional<at::Tensor>& minimums, const c10::optional<at::Tensor>& bias) {
  if (levels.scalar_type() == at::kByte) {
    TORCH_CHECK(minimums.has_value() && minimums->defined(), "int4 weights need their minimums");
    return int4_mm(x, levels, steps, *minimums, bias);
  }
  return int8_mm(x, levels, steps, bias);
}

TORCH_LIBRARY(tr_kernels, m) {
  m.def("int4_mm(Tensor x, Tensor q, Tensor d, Tensor mn, Tensor? bias=None) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor q, Tensor d, Tensor? bias=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
}
