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
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "tr_kernels.h"

namespace {

inline __m256 weights8(__m256 x) {
  const __m256 gone = _mm256_cmp_ps(x, _mm256_set1_ps(-88.3762626647949f), _CMP_LT_OQ);  // also -inf
  return _mm256_blendv_ps(tr::exp8(x), _mm256_setzero_ps(), gone);
}


// The scores q . k of keys j..j+7 (lane t: key j + t; keys past `last` repeat it and are not used):
// eight independent sums over the head dim, then one fixed pairwise sum of each key's eight lanes, so a
// key's score is the same bits in any lane of any group (and a query's scores never depend on which
// other keys are there). One key at a time waited on its own chain of D/8 dependent FMAs.
inline __m256 scores8(const float* qi, const float* keys, int64_t stride, int64_t j, int64_t last, int64_t D) {
  const float* k[8];
  for (int t = 0; t < 8; ++t) k[t] = keys + std::min(j + t, last) * stride;
  __m256 acc[8];
  for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qd = _mm256_loadu_ps(qi + d);
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k[t] + d), acc[t]);
  }
  // hadd twice: lane t of each half = key t's ((l0+l1)+(l2+l3)) (low half of its lanes) or the same of
  // its high half; then the halves added.
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// a[0 .. 8 LANES) += e[j] * v_j[0 .. 8 LANES) for keys j in [k0, k1), in key order (weights of exactly 0
// skipped: keys not seen). LANES fixed at compile time keeps the sums in registers: a loop over a
// runtime count kept them on the stack, a store and a load between each key's FMAs (~3x slower).
template <int LANES>
inline void weighted_sum(float* a, const float* e, const float* v, int64_t stride, int64_t k0, int64_t k1) {
  __m256 sums[LANES];
  for (int b = 0; b < LANES; ++b) sums[b] = _mm256_load_ps(a + 8 * b);
  for (int64_t j = k0; j < k1; ++j) {
    if (e[j] == 0.0f) continue;
    const __m256 w = _mm256_set1_ps(e[j]);
    const float* vj = v + j * stride;
    for (int b = 0; b < LANES; ++b) sums[b] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * b), sums[b]);
  }
  for (int b = 0; b < LANES; ++b) _mm256_store_ps(a + 8 * b, sums[b]);
}

}  // namespace

// No mask: every key visible (causal: key j visible to query i iff j <= i, keys cut to Q as
// transformers' SDPA path does).
at::Tensor tr::row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask_in, double scale, bool causal, double softcap) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == 1, "q, k, v: (1, heads, tokens, dim)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "float32");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = k.size(1);
  int64_t L = k.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= tr::kMaxHeadDim && k.size(3) == D && v.size(3) == D && v.size(2) == L && KVH > 0 &&
                  H % KVH == 0,
              "shapes");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "contiguous head dim");
  TORCH_CHECK(softcap >= 0, "softcap: > 0, or 0 for none");
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
  const bool capped = softcap > 0;
  const __m256 scale8 = _mm256_set1_ps(fscale), cap8 = _mm256_set1_ps(static_cast<float>(softcap));
  const bool* mask_bool = has_mask && bool_mask ? mask.data_ptr<bool>() : nullptr;
  const float* mask_add = has_mask && !bool_mask ? mask.data_ptr<float>() : nullptr;
  const int64_t mask_heads = has_mask && mask.size(1) > 1 ? mask.stride(1) : 0;
  const int64_t mask_row = has_mask ? mask.stride(2) : 0, mask_col = has_mask ? mask.stride(3) : 0;
  const int64_t qs1 = q.stride(1), qs2 = q.stride(2), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs1 = v.stride(1), vs2 = v.stride(2);
  // Work items: the queries of one key/value head (its heads' rows), up to kQueries at a time, which
  // go through the keys and values together in blocks of kKeys, so a block is read from L2 once per
  // item rather than once per query. On the AVX2 EPYC this alone measured no faster (the gain came from
  // scores8 and weighted_sum); it is kept for longer contexts and larger head groups, unmeasured.
  // Each query's arithmetic is still its own, in key order. Items of fewer queries where there are
  // few: about four items per thread (a one-token step has one query per head), up to kQueries.
  constexpr int64_t kQueries = 16, kKeys = 64;
  const int64_t per_head = group * Q;
  const int64_t per_item =
      std::max<int64_t>(1, std::min<int64_t>(kQueries, KVH * per_head / (4 * at::get_num_threads())));
  const int64_t chunks = (per_head + per_item - 1) / per_item;
  at::parallel_for(0, KVH * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kQueries * L);
    alignas(32) float acc[kQueries][tr::kMaxHeadDim];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t kh = item / chunks, first = (item % chunks) * per_item;
      const int64_t R = std::min(per_item, per_head - first);
      const float* kb = kp + kh * ks1;
      const float* vb = vp + kh * vs1;
      int64_t head[kQueries], row[kQueries], visible[kQueries];
      float top[kQueries], sum[kQueries];
      for (int64_t r = 0; r < R; ++r) {
        head[r] = kh * group + (first + r) / Q;
        row[r] = (first + r) % Q;
        visible[r] = (!has_mask && causal && Q > 1) ? std::min(row[r] + 1, L) : L;
        top[r] = -std::numeric_limits<float>::infinity();
      }
      const float hidden = -std::numeric_limits<float>::infinity();
      // Scores (masked keys: -inf; additively masked ones: the score plus the mask, as SDPA).
      for (int64_t k0 = 0; k0 < L; k0 += kKeys) {
        for (int64_t r = 0; r < R; ++r) {
          const float* qi = qp + head[r] * qs1 + row[r] * qs2;
          const int64_t mask_at = head[r] * mask_heads + row[r] * mask_row;
          float* e = scores.data() + r * L;
          const int64_t stop = std::min(k0 + kKeys, visible[r]);
          for (int64_t j0 = k0; j0 < stop; j0 += 8) {
            alignas(32) float s8[8];
            const __m256 raw = scores8(qi, kb, ks2, j0, visible[r] - 1, D);
            // Soft-capped as Gemma 2's eager attention: scaled, divided by the cap, tanh, times the cap.
            if (capped)
              _mm256_store_ps(s8, _mm256_mul_ps(tr::tanh8(_mm256_div_ps(_mm256_mul_ps(raw, scale8), cap8)), cap8));
            else
              _mm256_store_ps(s8, raw);
            for (int64_t j = j0; j < std::min(j0 + 8, stop); ++j) {
              const bool seen = mask_bool == nullptr || mask_bool[mask_at + j * mask_col];
              const float add = mask_add == nullptr ? 0.0f : mask_add[mask_at + j * mask_col];
              e[j] = !seen ? hidden : capped ? s8[j - j0] + add : s8[j - j0] * fscale + add;
              top[r] = std::max(top[r], e[j]);
            }
          }
          for (int64_t j = std::max(k0, visible[r]); j < std::min(k0 + kKeys, L); ++j) e[j] = hidden;
        }
      }
      // Weights e^(s - top): exactly 0 below e^-88 (keys not seen, -inf, and keys an additive mask
      // hides, s near the float minimum, as SDPA's exp gives them); summed one by one in key order (a
      // sum in vector lanes would group keys by index, and hidden keys between them would regroup them).
      for (int64_t r = 0; r < R; ++r) {
        float* e = scores.data() + r * L;
        const __m256 top8 = _mm256_set1_ps(top[r]);
        int64_t j = 0;
        for (; j + 8 <= L; j += 8) _mm256_storeu_ps(e + j, weights8(_mm256_sub_ps(_mm256_loadu_ps(e + j), top8)));
        if (j < L) {
          alignas(32) float tail[8];
          for (int64_t t = 0; t < 8; ++t) tail[t] = j + t < L ? e[j + t] - top[r] : 0.0f;
          _mm256_store_ps(tail, weights8(_mm256_load_ps(tail)));
          for (int64_t t = 0; j + t < L; ++t) e[j + t] = tail[t];
        }
        float total = 0.0f;
        for (j = 0; j < L; ++j) total += e[j];
        sum[r] = total;
        for (int64_t b = 0; b < D; b += 8) _mm256_store_ps(acc[r] + b, _mm256_setzero_ps());
      }
      // Values: each output lane sums its keys in order, a block of keys at a time, up to 64 dims
      // per pass so that the sums stay in registers.
      for (int64_t k0 = 0; k0 < L; k0 += kKeys) {
        const int64_t k1 = std::min(k0 + kKeys, L);
        for (int64_t r = 0; r < R; ++r) {
          const float* e = scores.data() + r * L;
          for (int64_t d0 = 0; d0 < D; d0 += 64) {
            float* a = acc[r] + d0;
            const float* v0 = vb + d0;
            switch (std::min<int64_t>(D - d0, 64) / 8) {
              case 8: weighted_sum<8>(a, e, v0, vs2, k0, k1); break;
              case 7: weighted_sum<7>(a, e, v0, vs2, k0, k1); break;
              case 6: weighted_sum<6>(a, e, v0, vs2, k0, k1); break;
              case 5: weighted_sum<5>(a, e, v0, vs2, k0, k1); break;
              case 4: weighted_sum<4>(a, e, v0, vs2, k0, k1); break;
              case 3: weighted_sum<3>(a, e, v0, vs2, k0, k1); break;
              case 2: weighted_sum<2>(a, e, v0, vs2, k0, k1); break;
              default: weighted_sum<1>(a, e, v0, vs2, k0, k1); break;
            }
          }
        }
      }
      const int64_t lanes = D / 8;
      for (int64_t r = 0; r < R; ++r) {
        float* oi = op + (row[r] * H + head[r]) * D;
        const __m256 total = _mm256_set1_ps(sum[r]);
        for (int64_t b = 0; b < lanes; ++b) _mm256_storeu_ps(oi + 8 * b, _mm256_div_ps(_mm256_load_ps(acc[r] + 8 * b), total));
      }
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) {
  m.def(
      "row_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal, float softcap=0.0) "
      "-> Tensor");
}
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) { m.impl("row_attention", &tr::row_attention); }
