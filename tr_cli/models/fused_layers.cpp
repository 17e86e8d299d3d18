// A decoder layer's parts as a few calls (models/fused_layers.py puts them in the model): Llama,
// Qwen2/3, Mistral, Phi-3 and Gemma 2/3 layers, whose differences are operands here (q/k norms,
// partial rotary, soft-capping, the MLP's activation; Gemma's extra norms are rms_norm calls).
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

// y = weight * (x * 1/sqrt(mean(x²) + eps)) for one row of D values (y may be x), as transformers'
// RMSNorm writes it; the same arithmetic for a layer's hidden rows and for a head's q/k rows.
void tr::norm_row(const float* xr, const float* wp, float eps, int64_t D, float* yr) {
  int64_t d = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= D; d += 8) {
    const __m256 v = _mm256_loadu_ps(xr + d);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float squares = tr::hsum(acc);
  for (; d < D; ++d) squares += xr[d] * xr[d];
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(D) + eps);
  const __m256 inv8 = _mm256_set1_ps(inv);
  for (d = 0; d + 8 <= D; d += 8)
    _mm256_storeu_ps(yr + d, _mm256_mul_ps(_mm256_loadu_ps(wp + d), _mm256_mul_ps(_mm256_loadu_ps(xr + d), inv8)));
  for (; d < D; ++d) yr[d] = wp[d] * (xr[d] * inv);
}

// rms_norm per row of x (..., D). Gemma's (1 + weight) norms come with 1 + weight as the weight
// (fused_layers.py adds it once, in float32 as the model does).
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
    for (int64_t r = begin; r < end; ++r) tr::norm_row(xp + r * D, wp, feps, D, op + r * D);
  });
  return out;
}

// x (1, T, hidden), normed -> q (1, H, T, D), k and v (1, KVH, T, D): one matmul over the layer's
// fused q/k/v weights; where given, an RMSNorm over each head's q (q_norm) and k (k_norm) values
// (Qwen3, Gemma 3); then the rotary embedding on q and k over their first R dims, R = cos/sin's last
// size (R < D: partial rotary, the rest passed through): x·cos + rotate_half(x)·sin, with cos/sin
// (1, T, R) as the model's rotary module gives them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tr::attention_in(
    const at::Tensor& x, const at::Tensor& levels, const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
    const c10::optional<at::Tensor>& bias, const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t heads,
    int64_t kv_heads, const c10::optional<at::Tensor>& q_norm_in, const c10::optional<at::Tensor>& k_norm_in,
    double norm_eps) {
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1, "x: (1, tokens, hidden)");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads: a multiple of kv_heads, both > 0");
  const at::Tensor y = tr::quantized_linear(x, levels, steps, minimums, bias);
  const int64_t T = x.size(1), width = y.size(-1), all_heads = heads + 2 * kv_heads;
  TORCH_CHECK(width % all_heads == 0, "q/k/v outputs: (heads + 2 kv_heads) * head_dim");
  const int64_t D = width / all_heads;
  // What the row attention after it takes, checked before the model's cache takes the new rows.
  TORCH_CHECK(D % 8 == 0 && D <= tr::kMaxHeadDim, "head_dim: a multiple of 8, at most ", tr::kMaxHeadDim);
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  check_float(cos, "cos");
  check_float(sin, "sin");
  const int64_t R = cos.size(-1), half = R / 2;
  TORCH_CHECK(R > 0 && R % 2 == 0 && R <= D && cos.numel() == T * R && sin.numel() == T * R,
              "cos, sin: (1, tokens, rotary dims), an even count up to head_dim");
  at::Tensor q_norm, k_norm;
  const bool normed = q_norm_in.has_value() && q_norm_in->defined();
  TORCH_CHECK(normed == (k_norm_in.has_value() && k_norm_in->defined()), "q_norm, k_norm: both or neither");
  if (normed) {
    q_norm = q_norm_in->contiguous(), k_norm = k_norm_in->contiguous();
    check_float(q_norm, "q_norm");
    check_float(k_norm, "k_norm");
    TORCH_CHECK(q_norm.numel() == D && k_norm.numel() == D, "q_norm, k_norm: one value per head dim");
  }
  at::Tensor q = at::empty({1, heads, T, D}, x.options());
  at::Tensor k = at::empty({1, kv_heads, T, D}, x.options());
  at::Tensor v = at::empty({1, kv_heads, T, D}, x.options());
  const float* yp = y.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const float* qn = normed ? q_norm.data_ptr<float>() : nullptr;
  const float* kn = normed ? k_norm.data_ptr<float>() : nullptr;
  const float eps = static_cast<float>(norm_eps);
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  alignas(32) float row[tr::kMaxHeadDim];
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cp + t * R;
    const float* s = sp + t * R;
    for (int64_t h = 0; h < all_heads; ++h) {
      const float* src = yp + t * width + h * D;
      if (h >= heads + kv_heads) {
        float* dst = vp + ((h - heads - kv_heads) * T + t) * D;
        for (int64_t i = 0; i < D; ++i) dst[i] = src[i];
        continue;
      }
      const bool query = h < heads;
      float* dst = query ? qp + (h * T + t) * D : kp + ((h - heads) * T + t) * D;
      if (normed) {
        tr::norm_row(src, query ? qn : kn, eps, D, row);
        src = row;
      }
      for (int64_t i = 0; i < half; ++i) {
        const float rotated = -src[i + half] * s[i];
        dst[i] = src[i] * c[i] + rotated;
      }
      for (int64_t i = half; i < R; ++i) {
        const float rotated = src[i - half] * s[i];
        dst[i] = src[i] * c[i] + rotated;
      }
      for (int64_t i = R; i < D; ++i) dst[i] = src[i];
    }
  }
  return {q, k, v};
}

// The attention over the cache (q from attention_in, k/v the cache's; scores soft-capped where
// softcap > 0, as Gemma 2's) and o_proj: (1, T, hidden).
at::Tensor tr::attention_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask, double scale, bool causal, const at::Tensor& levels,
                         const at::Tensor& steps, const c10::optional<at::Tensor>& minimums,
                         const c10::optional<at::Tensor>& bias, double softcap) {
  const at::Tensor attended = tr::row_attention(q, k, v, mask, scale, causal, softcap);
  return tr::quantized_linear(attended.view({1, q.size(2), q.size(1) * q.size(3)}), levels, steps, minimums, bias);
}

// down(act(gate(x)) * up(x)) with gate and up as one matmul over their concatenated weights
// (outputs [gate | up]); act: kSilu, silu(g) = g / (1 + e^-g), or kGeluTanh, transformers'
// gelu_pytorch_tanh (Gemma's): g/2 · (1 + tanh(√(2/π) (g + 0.044715 g³))).
at::Tensor tr::gated_mlp(const at::Tensor& x, const at::Tensor& gate_up_levels, const at::Tensor& gate_up_steps,
                     const c10::optional<at::Tensor>& gate_up_minimums, const c10::optional<at::Tensor>& gate_up_bias,
                     const at::Tensor& down_levels, const at::Tensor& down_steps,
                     const c10::optional<at::Tensor>& down_minimums, const c10::optional<at::Tensor>& down_bias,
                     int64_t activation) {
  TORCH_CHECK(activation == tr::kSilu || activation == tr::kGeluTanh, "activation: 0 (silu) or 1 (gelu_tanh)");
  const at::Tensor gate_up = tr::quantized_linear(x, gate_up_levels, gate_up_steps, gate_up_minimums, gate_up_bias);
  const int64_t width = gate_up.size(-1), inner = width / 2, rows = gate_up.numel() / std::max<int64_t>(width, 1);
  TORCH_CHECK(width % 2 == 0, "gate/up outputs: [gate | up], an even count");
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = inner;
  at::Tensor product = at::empty(shape, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* pp = product.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256 root = _mm256_set1_ps(0.7978845608028654f), cubic = _mm256_set1_ps(0.044715f);
  const bool gelu = activation == tr::kGeluTanh;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gp + r * width;
      const float* u = g + inner;
      float* p = pp + r * inner;
      auto product8 = [&](__m256 gv, __m256 uv) {
        if (gelu) {
          const __m256 inner8 = _mm256_mul_ps(root, _mm256_fmadd_ps(_mm256_mul_ps(cubic, gv), _mm256_mul_ps(gv, gv), gv));
          return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, gv), _mm256_add_ps(one, tr::tanh8(inner8))), uv);
        }
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
      "int heads, int kv_heads, Tensor? q_norm=None, Tensor? k_norm=None, float norm_eps=1e-6) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_out(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal, Tensor levels, "
      "Tensor steps, Tensor? minimums, Tensor? bias, float softcap=0.0) -> Tensor");
  m.def(
      "gated_mlp(Tensor x, Tensor gate_up_levels, Tensor gate_up_steps, Tensor? gate_up_minimums, "
      "Tensor? gate_up_bias, Tensor down_levels, Tensor down_steps, Tensor? down_minimums, Tensor? down_bias, "
      "int activation=0) -> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) {
  m.impl("rms_norm", &tr::rms_norm);
  m.impl("attention_in", &tr::attention_in);
  m.impl("attention_out", &tr::attention_out);
  m.impl("gated_mlp", &tr::gated_mlp);
}
