// tr's attention for models on tr's kernels (built with quantized_matmul.cpp: models/native_kernels.py).
//
// Each (head, query) row is computed alone: scores over the keys it may see, in key order, a softmax,
// and the values' weighted sum, in one fixed order per row. So a query gives the same bits alone or
// among others, and with hidden keys between the ones it sees or without them (masked keys add exact
// zeros): a draft tree's rows then equal one-token steps over the compacted cache bit for bit, which
// SDPA does not promise (its blocking follows the number of queries) and which matters once the
// activations are rounded to int8 (tiny differences move roundings). float32; head dim a multiple of 8.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <limits>
#include <vector>
#include "tr_kernels.h"

namespace {

inline __m256 weights8(__m256 x) {
  const __m256 gone = _mm256_cmp_ps(x, _mm256_set1_ps(-88.3762626647949f), _CMP_LT_OQ);  // also -inf
  return _mm256_blendv_ps(tr::exp8(x), _mm256_setzero_ps(), gone);
}


}  // namespace

// No mask: every key visible (causal: key j visible to query i iff j <= i, keys cut to Q as
// transformers' SDPA path does).
at::Tensor tr::row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask_in, double scale, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == 1, "q, k, v: (1, heads, tokens, dim)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "float32");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = k.size(1);
  int64_t L = k.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= tr::kMaxHeadDim && k.size(3) == D && v.size(3) == D && v.size(2) == L && KVH > 0 &&
                  H % KVH == 0,
              "shapes");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "contiguous head dim");
  const bool has_mask = mask_in.has_value() && mask_in->defined();
  if (!has_mask && causal && Q > 1) L = std::min(L, Q);
  at::Tensor mask;
  bool bool_mask = false;
  if (has_mask) {
    mask = *mask_in;
    TORCH_CHECK(mask.dim() == 4 && mask.size(0) == 1 && (mask.size(1) == 1 || mask.size(1) == H) &&
                    mask.size(2) == Q && mask.size(3) >= L,
                "mask: (1, 1|heads, tokens, keys)");
    bool_mask = mask.scalar_type() == at::kBool;
    TORCH_CHECK(bool_mask || mask.scalar_type() == at::kFloat, "mask: float32 or bool");
  }
  at::Tensor out = at::empty({1, Q, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / KVH;
  const float fscale = static_cast<float>(scale);
  const bool* mask_bool = has_mask && bool_mask ? mask.data_ptr<bool>() : nullptr;
  const float* mask_add = has_mask && !bool_mask ? mask.data_ptr<float>() : nullptr;
  const int64_t mask_heads = has_mask && mask.size(1) > 1 ? mask.stride(1) : 0;
  const int64_t mask_row = has_mask ? mask.stride(2) : 0, mask_col = has_mask ? mask.stride(3) : 0;
  const int64_t qs1 = q.stride(1), qs2 = q.stride(2), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs1 = v.stride(1), vs2 = v.stride(2);
  at::parallel_for(0, H * Q, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(L);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / Q, i = t % Q, kh = h / group;
      const float* qi = qp + h * qs1 + i * qs2;
      const float* kb = kp + kh * ks1;
      const float* vb = vp + kh * vs1;
      const int64_t mask_at = h * mask_heads + i * mask_row;
      const int64_t visible_to = (!has_mask && causal && Q > 1) ? i + 1 : L;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < L; ++j) {
        const bool seen = j < visible_to && (mask_bool == nullptr || mask_bool[mask_at + j * mask_col]);
        if (!seen) {
          e[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float add = mask_add == nullptr ? 0.0f : mask_add[mask_at + j * mask_col];
        const float* kj = kb + j * ks2;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d), _mm256_loadu_ps(kj + d), acc);
        const float s = tr::hsum(acc) * fscale + add;
        e[j] = s;
        top = std::max(top, s);
      }
      // Weights e^(s - top): exactly 0 below e^-88 (keys not seen, -inf, and keys an additive mask
      // hides, s near the float minimum, as SDPA's exp gives them); summed one by one in key order (a
      // sum in vector lanes would group keys by index, and hidden keys between them would regroup them).
      const __m256 top8 = _mm256_set1_ps(top);
      int64_t j = 0;
      for (; j + 8 <= L; j += 8) _mm256_storeu_ps(e.data() + j, weights8(_mm256_sub_ps(_mm256_loadu_ps(e.data() + j), top8)));
      if (j < L) {
        alignas(32) float tail[8];
        for (int64_t t = 0; t < 8; ++t) tail[t] = j + t < L ? e[j + t] - top : 0.0f;
        _mm256_store_ps(tail, weights8(_mm256_load_ps(tail)));
        for (int64_t t = 0; j + t < L; ++t) e[j + t] = tail[t];
      }
      float sum = 0.0f;
      for (j = 0; j < L; ++j) sum += e[j];
      // Values: one pass over the keys, each output lane summing its keys in order.
      __m256 acc[tr::kMaxHeadDim / 8];
      const int64_t lanes = D / 8;
      for (int64_t b = 0; b < lanes; ++b) acc[b] = _mm256_setzero_ps();
      for (j = 0; j < L; ++j) {
        if (e[j] == 0.0f) continue;
        const __m256 w = _mm256_set1_ps(e[j]);
        const float* vj = vb + j * v.stride(2);
        for (int64_t b = 0; b < lanes; ++b) acc[b] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * b), acc[b]);
      }
      float* oi = op + (i * H + h) * D;
      const __m256 total = _mm256_set1_ps(sum);
      for (int64_t b = 0; b < lanes; ++b) _mm256_storeu_ps(oi + 8 * b, _mm256_div_ps(acc[b], total));
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) {
  m.def("row_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal) -> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) { m.impl("row_attention", &tr::row_attention); }
