// The k largest logits of each row, in one pass (built with tr's other kernels: models/native_kernels.py).
//
// Verification needs each node's top-k (the matrix update) and its argmax (acceptance). torch.topk
// sorts its way through all 49 k logits of a row (~100 us a row on a 2-core EPYC); here a row is
// read once, eight values at a time against the k-th best so far, and only the few values that beat
// it (~k ln(V/k) of them on real logits) are inserted into a sorted list: ~10 us a row.
//
// The order is fixed: larger values first, equal values by smaller index, NaN above everything (as
// torch's max and argmax treat it). So column 0 is exactly `argmax` (the first index among equal
// maxima), even when more than k values tie.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <tuple>

namespace {

// `value` at `index` ranks before the entry (best, at) already kept? Only ever asked with index > at,
// so equal values keep the earlier index ahead.
inline bool beats(float value, float best) {
  if (std::isnan(value)) return !std::isnan(best);
  return value > best;  // false when best is NaN
}

struct Kept {
  float* values;
  int64_t* indices;
  int64_t k;
  int64_t size = 0;

  // The k-th best so far, or none while fewer than k are kept (then everything enters).
  bool full() const { return size == k; }

  void offer(float value, int64_t index) {
    if (full() && !beats(value, values[k - 1])) return;
    int64_t slot = full() ? k - 1 : size++;
    while (slot > 0 && beats(value, values[slot - 1])) {
      values[slot] = values[slot - 1];
      indices[slot] = indices[slot - 1];
      --slot;
    }
    values[slot] = value;
    indices[slot] = index;
  }
};

void top_of_row(const float* x, int64_t n, Kept& kept) {
  int64_t j = 0;
  for (; j < n && !kept.full(); ++j) kept.offer(x[j], j);
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const float threshold = kept.values[kept.k - 1];
    if (std::isnan(threshold)) return;  // k NaNs kept: nothing later ranks before them
    // Lanes greater than the k-th best, or NaN (unordered with themselves).
    const __m256 above = _mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(threshold), _CMP_GT_OQ),
                                      _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(above));
    while (mask) {
      const int lane = __builtin_ctz(mask);
      kept.offer(x[j + lane], j + lane);  // re-checked: an earlier lane may have raised the bar
      mask &= mask - 1;
    }
  }
  for (; j < n; ++j) kept.offer(x[j], j);
}

std::tuple<at::Tensor, at::Tensor> row_topk(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "row_topk: a (rows, n) float32 tensor");
  TORCH_CHECK(k >= 1 && k <= x.size(1), "row_topk: k must be in 1..n");
  const at::Tensor input = x.contiguous();
  const int64_t rows = input.size(0), n = input.size(1);
  at::Tensor values = at::empty({rows, k}, input.options());
  at::Tensor indices = at::empty({rows, k}, input.options().dtype(at::kLong));
  const float* in = input.data_ptr<float>();
  float* out_values = values.data_ptr<float>();
  int64_t* out_indices = indices.data_ptr<int64_t>();
  // ~10 us a row: waking the other threads pays only for a prompt's many rows, not a tree's few.
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      Kept kept{out_values + r * k, out_indices + r * k, k};
      top_of_row(in + r * n, n, kept);
    }
  });
  return {values, indices};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) { m.def("row_topk(Tensor x, int k) -> (Tensor, Tensor)"); }
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) { m.impl("row_topk", &row_topk); }
