// Keeping a step's accepted path in the KV cache, every layer's keys and values in one call (built
// with tr's other kernels: models/native_kernels.py; core/kv_cache.py's CompactingCache calls it).
//
// After verification the cache keeps the prefix and the accepted tree rows, moved down next to it.
// As tensor ops that is an advanced-index gather and scatter per buffer: 120 small ops a step on a
// 30-layer model (~0.17 ms on a 2-core EPYC). Here it is a memmove per (buffer, head, row).
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <cstring>
#include <vector>

namespace {

// buffers: (1, heads, capacity, head dim) contiguous; rows: int64, ascending, rows[i] >= start + i
// (the accepted nodes after the root, by absolute position). Row rows[i] moves to start + i; moving in
// order never overwrites a row still to be read, since every later source lies past its destination.
void keep_rows(const std::vector<at::Tensor>& buffers, int64_t start, const at::Tensor& rows) {
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(),
              "keep_rows: rows must be a contiguous 1-D int64 tensor");
  const int64_t count = rows.numel();
  const int64_t* source = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(source[i] >= start + i && (i == 0 || source[i] > source[i - 1]),
                "keep_rows: rows must ascend from start, each at or past its destination");
  }
  for (const at::Tensor& buffer : buffers) {
    TORCH_CHECK(buffer.dim() == 4 && buffer.size(0) == 1 && buffer.is_contiguous(),
                "keep_rows: buffers must be contiguous (1, heads, capacity, head dim)");
    const int64_t heads = buffer.size(1), capacity = buffer.size(2);
    TORCH_CHECK(count == 0 || source[count - 1] < capacity, "keep_rows: a row lies past the buffer's capacity");
    const int64_t row_bytes = buffer.size(3) * buffer.element_size();
    char* base = static_cast<char*>(buffer.data_ptr());
    for (int64_t h = 0; h < heads; ++h) {
      char* head = base + h * capacity * row_bytes;
      for (int64_t i = 0; i < count; ++i) {
        if (source[i] != start + i) std::memmove(head + (start + i) * row_bytes, head + source[i] * row_bytes, row_bytes);
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) { m.def("keep_rows(Tensor(a!)[] buffers, int start, Tensor rows) -> ()"); }
TORCH_LIBRARY_IMPL(tr_kernels, CPU, m) { m.impl("keep_rows", &keep_rows); }
