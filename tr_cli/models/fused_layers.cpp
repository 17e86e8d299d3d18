// A Llama-family decoder layer's parts as a few calls (models/fused_layers.py puts them in the model).
//
// A one-token step on tr's int4 kernels spent as long between the matmuls as in them: ~45 small
// torch operations a layer (norms, rotary embedding, reshapes, the activation), each a Python call
// and a dispatch. Here a layer is five calls: the input norm, the attention's input (q/k/v matmul and
// rotary embedding), the cache update (the model's cache, in Python), the attention's output
// (attention and o_proj), the post-attention norm, the MLP (gate/up matmul, SiLU, product, down).
//
// Every value depends on its own row only and is computed in one fixed order, as in the kernels
// these call, so a tree's rows equal one-token steps bit for bit. Both `generate` and tr's forward
// run these same functions (the model's modules call them), which is what keeps tr lossless here.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
#include <tuple>
#include <vector>
#include "tr_kernels.h"

namespace {

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, ": float32");
}

}  // namespace

// y = weight * (x * 1/sqrt(mean(x²) + eps)) per row of x (..., D), as transformers' RMSNorm writes it.
at::Tensor tr::rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_float(x_in, "x");
  check_float(weight_in, "weight");
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  TORCH_CHECK(weight.numel() == D, "weight: one value per feature");
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * D;
      float* yr = op + r * D;
      int64_t d = 0;
      __m256 acc = _mm256_setzero_ps();
      for (; d + 8 <= D; d += 8) {
        const __m256 v = _mm256_loadu_ps(xr + d);
        acc = _mm256_fmadd_ps(v, v, acc);
      }
      float squares = tr::hsum(acc);
      for (; d < D; ++d) squares += xr[d] * xr[d];
      const float inv = 1.0f / std::sqrt(squares / static_cast<float>(D) + feps);
      const __m256 inv8 = _mm256_set1_ps(inv);
      for (d = 0; d + 8 <= D; d += 8)
        _mm256_storeu_ps(yr + d, _mm256_mul_ps(_mm256_loadu_ps(wp + d), _mm256_mul_ps(_mm256_loadu_ps(xr + d), inv8)));
      for (; d < D; ++d) yr[d] = wp[d] * (xr[d] * inv);
    }
  });
  return out;
}

// x (1, T, hidden), normed -> q (1, H, T, D), k and v (1, KVH, T, D): one matmul over the layer's
// fused q/k/v weights, then the rotary embedding on q and k: x·cos + rotate_half(x)·sin, with cos/sin
// (1, T, D) as the model's rotary module gives them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tr::attention_in(
    const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
    const c10::optional<at::Tensor>& bias, const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t heads,
    int64_t kv_heads) {
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1, "x: (1, tokens, hidden)");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads: a multiple of kv_heads, both > 0");
  const at::Tensor y = tr::quantized_linear(x, levels, steps, minimums, bias);
  const int64_t T = x.size(1), width = y.size(-1), all_heads = heads + 2 * kv_heads;
  TORCH_CHECK(width % all_heads == 0, "q/k/v outputs: (heads + 2 kv_heads) * head_dim");
  const int64_t D = width / all_heads, half = D / 2;
  // What the row attention after it takes, checked before the model's cache takes the new rows.
  TORCH_CHECK(D % 8 == 0 && D <= tr::kMaxHeadDim, "head_dim: a multiple of 8, at most ", tr::kMaxHeadDim);
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  check_float(cos, "cos");
  check_float(sin, "sin");
  TORCH_CHECK(cos.numel() == T * D && sin.numel() == T * D, "cos, sin: (1, tokens, head_dim)");
  at::Tensor q = at::empty({1, heads, T, D}, x.options());
  at::Tensor k = at::empty({1, kv_heads, T, D}, x.options());
  at::Tensor v = at::empty({1, kv_heads, T, D}, x.options());
  const float* yp = y.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cp + t * D;
    const float* s = sp + t * D;
    for (int64_t h = 0; h < all_heads; ++h) {
      const float* src = yp + t * width + h * D;
      if (h >= heads + kv_heads) {
        float* dst = vp + ((h - heads - kv_heads) * T + t) * D;
        for (int64_t i = 0; i < D; ++i) dst[i] = src[i];
        continue;
      }
      float* dst = h < heads ? qp + (h * T + t) * D : kp + ((h - heads) * T + t) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float rotated = -src[i + half] * s[i];
        dst[i] = src[i] * c[i] + rotated;
      }
      for (int64_t i = half; i < D; ++i) {
        const float rotated = src[i - half] * s[i];
        dst[i] = src[i] * c[i] + rotated;
      }
    }
  }
  return {q, k, v};
}

// The attention over the cache (q from attention_in, k/v the cache's) and o_proj: (1, T, hidden).
at::Tensor tr::attention_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask, double scale, bool causal, const at::Tensor& levels,
                         const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
                         const c10::optional<at::Tensor>& bias) {
  const at::Tensor attended = tr::row_attention(q, k, v, mask, scale, causal);
  return tr::quantized_linear(attended.view({1, q.size(2), q.size(1) * q.size(3)}), levels, steps, minimums, bias);
}

// down(silu(gate(x)) * up(x)) with gate and up as one matmul over their concatenated weights
// (outputs [gate | up]); silu(g) = g / (1 + e^-g).
at::Tensor tr::silu_mlp(const at::Tensor& x, const at::Tensor& gate_up_levels, const at::Tensor& gate_up_steps,
                    const c10::optional<at::Tensor>& gate_up_minimums, const c10::optional<at::Tensor>& gate_up_bias,
                    const at::Tensor& down_levels, const at::Tensor& down_steps,
                    const c10::optional<at::Tensor>& down_minimums, const c10::optional<at::Tensor>& down_bias) {
  const at::Tensor gate_up = tr::quantized_linear(x, gate_up_levels, gate_up_steps, gate_up_minimums, gate_up_bias);
  const int64_t width = gate_up.size(-1), inner = width / 2, rows = gate_up.numel() / std::max<int64_t>(width, 1);
  TORCH_CHECK(width % 2 == 0, "gate/up outputs: [gate | up], an even count");
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = inner;
  at::Tensor product = at::empty(shape, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* pp = product.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gp + r * width;
      const float* u = g + inner;
      float* p = pp + r * inner;
      auto product8 = [&](__m256 gv, __m256 uv) {
        return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, tr::exp8(_mm256_xor_ps(gv, sign)))), uv);
      };
      int64_t i = 0;
      for (; i + 8 <= inner; i += 8) _mm256_storeu_ps(p + i, product8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
      for (; i < inner; i += 8) {  // a width that is not a multiple of 8: the last lanes through a buffer
        alignas(32) float gl[8] = {}, ul[8] = {}, pl[8];
        const int64_t lanes = std::min<int64_t>(8, inner - i);
        for (int64_t l = 0; l < lanes; ++l) gl[l] = g[i + l], ul[l] = u[i + l];
        _mm256_store_ps(pl, product8(_mm256_load_ps(gl), _mm256_load_ps(ul)));
        for (int64_t l = 0; l < lanes; ++l) p[i + l] = pl[l];
      }
    }
  });
  return tr::quantized_linear(product, down_levels, down_steps, down_minimums, down_bias);
}

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def(
      "attention_in(Tensor x, Tensor levels, Tensor steps, Tensor? minimums, Tensor? bias, Tensor cos, Tensor sin, "
      "int heads, int kv_heads) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_out(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal, Tensor levels, "
      "Tensor steps, Tensor? minimums, Tensor? bias) -> Tensor");
  m.def(
      "silu_mlp(Tensor x, Tensor gate_up_levels, Tensor gate_up_steps, Tensor? gate_up_minimums, "
      "Tensor? gate_up_bias, Tensor down_levels, Tensor down_steps, Tensor? down_minimums, Tensor? down_bias) "
      "-> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) {
  m.impl("rms_norm", &tr::rms_norm);
  m.impl("attention_in", &tr::attention_in);
  m.impl("attention_out", &tr::attention_out);
  m.impl("silu_mlp", &tr::silu_mlp);
}
