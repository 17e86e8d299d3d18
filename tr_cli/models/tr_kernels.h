// What tr's kernel sources share (built together: models/native_kernels.py). float32 throughout.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <immintrin.h>
#include <tuple>

namespace tr {

// Head dims the row attention takes (multiples of 8 up to this; every Llama-family model's is 64-256);
// row_attention.py's `supports` says the same on the Python side.
constexpr int64_t kMaxHeadDim = 256;

// y = x Wᵀ (+ bias), x (..., K) -> (..., N), W as models/weights.py packs it, in blocks of eight output
// columns: int4 (levels uint8 (N/8, K/32, 128), float16 steps and minimums (N/8, K/32, 8)) or int8
// (levels int8 (N/8, K/32, 256), float16 steps; no minimums). Each row of x computed alone, in one
// fixed order.
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps,
                            const c10::optional<at::Tensor>& minimums, const c10::optional<at::Tensor>& bias);

// q (1, H, Q, D), k/v (1, KVH, L, D), mask (1, 1|H, Q, L) float (added) or bool (visible), or none ->
// (1, Q, H, D); each (head, query) row alone, keys in order (row_attention.cpp). softcap > 0: each
// scaled score s becomes tanh(s / softcap) * softcap before the mask (Gemma 2), else scores as they are.
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask, double scale, bool causal, double softcap = 0.0);

// A decoder layer's parts (fused_layers.cpp): y = weight * x / sqrt(mean(x²) + eps) per row (norm_row:
// one row); q/k/v matmul (+ per-head q/k norms) + rotary embedding -> q (1, H, T, D), k, v (1, KVH, T, D);
// attention + o_proj -> (1, T, hidden); down(act(gate) * up) with gate/up one matmul.
void norm_row(const float* x, const float* weight, float eps, int64_t D, float* y);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_in(
    const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
    const c10::optional<at::Tensor>& bias, const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
    int64_t kv_heads, const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm,
    double norm_eps);
at::Tensor attention_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask, double scale, bool causal, const at::Tensor& levels,
                         const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
                         const c10::optional<at::Tensor>& bias, double softcap);
// The gated MLP's activations (fused_layers.py's ACTIVATIONS names them the same).
constexpr int64_t kSilu = 0, kGeluTanh = 1;
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate_up_levels, const at::Tensor& gate_up_steps,
                     const c10::optional<at::Tensor>& gate_up_minimums, const c10::optional<at::Tensor>& gate_up_bias,
                     const at::Tensor& down_levels, const at::Tensor& down_steps,
                     const c10::optional<at::Tensor>& down_minimums, const c10::optional<at::Tensor>& down_bias,
                     int64_t activation);

// e^x for 8 floats (Cephes' expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp), the same
// bits for the same input wherever it runs, which is all the softmax needs.
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(0x7f)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

// tanh(x) for 8 floats as 1 - 2 / (e^2x + 1) on exp8 (absolute error ~1e-7; ±1 past |x| ~ 44): the
// same bits for the same input wherever it runs.
inline __m256 tanh8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_add_ps(x, x));
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

}  // namespace tr
