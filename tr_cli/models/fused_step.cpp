// All decoder layers of a model on tr's fused layers (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3) and its
// final norm in one call (models/fused_layers.py's FusedStack; core/forward.py's direct path calls it).
//
// The fused modules already make a layer five calls; a step still paid ~150 Python calls and the cache's
// update per layer. Here the weights are gathered once, and a step is one call that runs, for each layer,
// the very functions the modules call (fused_layers.cpp) with the same inputs, writes the new keys and
// values into the cache's own buffers where the cache's update would put them, and adds the residuals
// (a float32 add is one rounding whoever computes it): the same bits as the model's forward through its
// modules, which is what `generate` runs.
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <cstring>
#include <vector>
#include "tr_kernels.h"

namespace {

using Optional = c10::optional<at::Tensor>;

struct Linear {
  at::Tensor levels, steps;
  Optional minimums, bias;
};

struct Layer {
  at::Tensor input_norm, mlp_norm;
  Optional q_norm, k_norm, attention_out_norm, mlp_out_norm;  // Qwen3/Gemma 3's; Gemma's sandwich norms
  double input_eps = 0, head_eps = 0, attention_out_eps = 0, mlp_eps = 0, mlp_out_eps = 0;
  Linear qkv, o, gate_up, down;
  int64_t rope = 0, activation = tr::kSilu;  // which cos/sin the layer takes; its MLP's activation
  double scale = 1, softcap = 0;
};

// Per layer, in the Python side's order (fused_layers.py's FusedStack): input norm, q norm, k norm,
// q/k/v (levels, steps, minimums, bias), o (same), the attention output's norm, the MLP's input norm,
// the MLP output's norm, gate/up (same), down (same); the optional ones None where the layer has none.
constexpr int64_t kPerLayer = 22;
// Per layer: the epsilons of the input norm, the q/k norms, the attention output's, the MLP input's
// and the MLP output's norms.
constexpr int64_t kEpsPerLayer = 5;

// x += y, elementwise (both contiguous float32 of one shape).
void add_into(at::Tensor& x, const at::Tensor& y) {
  float* xp = x.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) xp[i] += yp[i];
}

// new (1, KVH, T, D) rows into buffer (1, KVH, capacity, D) at positions [start, start + T).
void write_rows(const at::Tensor& buffer, const at::Tensor& rows, int64_t start) {
  const int64_t heads = rows.size(1), T = rows.size(2), D = rows.size(3), capacity = buffer.size(2);
  TORCH_CHECK(buffer.is_contiguous() && buffer.dim() == 4 && buffer.size(0) == 1 && buffer.size(1) == heads &&
                  buffer.size(3) == D && start >= 0 && start + T <= capacity && buffer.scalar_type() == at::kFloat &&
                  rows.scalar_type() == at::kFloat && rows.is_contiguous(),
              "cache buffers: contiguous float32 (1, kv_heads, capacity, head_dim) with room for the new rows");
  const float* src = rows.data_ptr<float>();
  float* dst = buffer.data_ptr<float>();
  for (int64_t h = 0; h < heads; ++h)
    std::memcpy(dst + (h * capacity + start) * D, src + h * T * D, sizeof(float) * T * D);
}

class FusedStack : public torch::CustomClassHolder {
 public:
  // tensors: kPerLayer per layer, then the final norm; eps: kEpsPerLayer per layer, then the final
  // norm's; per layer: which cos/sin it takes (rope), its MLP's activation, its attention's scale and
  // soft-cap (0: none).
  FusedStack(c10::List<Optional> tensors, std::vector<double> eps, int64_t heads, int64_t kv_heads,
             std::vector<int64_t> rope, std::vector<int64_t> activation, std::vector<double> scale,
             std::vector<double> softcap, bool causal)
      : heads_(heads), kv_heads_(kv_heads), causal_(causal) {
    const int64_t count = static_cast<int64_t>(tensors.size());
    TORCH_CHECK(count % kPerLayer == 1 && count > 1, "tensors: ", kPerLayer, " per layer, then the final norm");
    const int64_t layers = count / kPerLayer;
    TORCH_CHECK(static_cast<int64_t>(eps.size()) == kEpsPerLayer * layers + 1,
                "eps: ", kEpsPerLayer, " per layer, then the final norm's");
    for (const auto* per_layer : {&rope, &activation})
      TORCH_CHECK(static_cast<int64_t>(per_layer->size()) == layers, "rope, activation: one per layer");
    TORCH_CHECK(static_cast<int64_t>(scale.size()) == layers && static_cast<int64_t>(softcap.size()) == layers,
                "scale, softcap: one per layer");
    auto required = [&](int64_t i) {
      const Optional t = tensors.get(i);
      TORCH_CHECK(t.has_value() && t->defined(), "tensor ", i, " is required");
      return *t;
    };
    // The order is fused_layers.py's FusedStack; each entry's kind is checked, so a reordering there
    // is an error here, not weights read as something else.
    auto norm_weight = [&](const at::Tensor& t, int64_t i) {
      TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kFloat, "tensor ", i, ": a norm's float32 weight");
      return t;
    };
    auto norm = [&](int64_t i) { return norm_weight(required(i), i); };
    auto maybe_norm = [&](int64_t i) -> Optional {
      const Optional t = tensors.get(i);
      if (!t.has_value() || !t->defined()) return c10::nullopt;
      return norm_weight(*t, i);
    };
    auto linear = [&](int64_t i) {
      const Linear l{required(i), required(i + 1), tensors.get(i + 2), tensors.get(i + 3)};
      TORCH_CHECK(l.levels.dim() == 3 && (l.levels.scalar_type() == at::kByte || l.levels.scalar_type() == at::kChar),
                  "tensor ", i, ": a layer's int4/int8 levels");
      TORCH_CHECK(l.steps.dim() == 3 && l.steps.scalar_type() == at::kHalf, "tensor ", i + 1, ": float16 steps");
      return l;
    };
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t at = l * kPerLayer;
      const double* e = eps.data() + l * kEpsPerLayer;
      Layer layer;
      layer.input_norm = norm(at);
      layer.q_norm = maybe_norm(at + 1);
      layer.k_norm = maybe_norm(at + 2);
      TORCH_CHECK(layer.q_norm.has_value() == layer.k_norm.has_value(), "layer ", l, ": q and k norms, or neither");
      layer.qkv = linear(at + 3);
      layer.o = linear(at + 7);
      layer.attention_out_norm = maybe_norm(at + 11);
      layer.mlp_norm = norm(at + 12);
      layer.mlp_out_norm = maybe_norm(at + 13);
      layer.gate_up = linear(at + 14);
      layer.down = linear(at + 18);
      layer.input_eps = e[0], layer.head_eps = e[1], layer.attention_out_eps = e[2];
      layer.mlp_eps = e[3], layer.mlp_out_eps = e[4];
      TORCH_CHECK(rope[l] >= 0, "rope: an index into cos/sin");
      layer.rope = rope[l];
      layer.activation = activation[l];
      layer.scale = scale[l];
      layer.softcap = softcap[l];
      layers_.push_back(std::move(layer));
    }
    final_norm_ = norm(count - 1);
    final_eps_ = eps.back();
  }

  // hidden (1, T, hidden) embeddings; cos/sin: per rotary kind (each (1, T, rotary dims)); masks one per
  // layer or one for all (each (1, 1|H, T, length + T) or none); keys/values each layer's cache buffers,
  // the new rows going to [length, length + T). Returns the final norm's output (1, T, hidden).
  at::Tensor step(const at::Tensor& hidden, std::vector<at::Tensor> cos, std::vector<at::Tensor> sin,
                  c10::List<Optional> masks, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                  int64_t length) {
    const int64_t layers = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(static_cast<int64_t>(keys.size()) == layers && static_cast<int64_t>(values.size()) == layers,
                "keys, values: one buffer per layer");
    TORCH_CHECK(masks.size() == 1 || static_cast<int64_t>(masks.size()) == layers, "masks: one, or one per layer");
    TORCH_CHECK(cos.size() == sin.size(), "cos, sin: one of each per rotary kind");
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && hidden.scalar_type() == at::kFloat,
                "hidden: float32 (1, tokens, hidden)");
    const int64_t T = hidden.size(1);
    at::Tensor x = hidden.contiguous().clone();
    for (int64_t l = 0; l < layers; ++l) {
      const Layer& layer = layers_[l];
      TORCH_CHECK(layer.rope < static_cast<int64_t>(cos.size()), "layer ", l, ": no cos/sin for its rotary kind");
      const at::Tensor normed = tr::rms_norm(x, layer.input_norm, layer.input_eps);
      const auto [q, k, v] =
          tr::attention_in(normed, layer.qkv.levels, layer.qkv.steps, layer.qkv.minimums, layer.qkv.bias,
                           cos[layer.rope], sin[layer.rope], heads_, kv_heads_, layer.q_norm, layer.k_norm,
                           layer.head_eps);
      write_rows(keys[l], k, length);
      write_rows(values[l], v, length);
      const Optional mask = masks.get(masks.size() == 1 ? 0 : l);
      at::Tensor attended = tr::attention_out(q, keys[l].narrow(2, 0, length + T), values[l].narrow(2, 0, length + T),
                                              mask, layer.scale, causal_, layer.o.levels, layer.o.steps,
                                              layer.o.minimums, layer.o.bias, layer.softcap);
      if (layer.attention_out_norm.has_value())
        attended = tr::rms_norm(attended, *layer.attention_out_norm, layer.attention_out_eps);
      add_into(x, attended);
      at::Tensor mlp = tr::gated_mlp(tr::rms_norm(x, layer.mlp_norm, layer.mlp_eps), layer.gate_up.levels,
                                     layer.gate_up.steps, layer.gate_up.minimums, layer.gate_up.bias,
                                     layer.down.levels, layer.down.steps, layer.down.minimums, layer.down.bias,
                                     layer.activation);
      if (layer.mlp_out_norm.has_value()) mlp = tr::rms_norm(mlp, *layer.mlp_out_norm, layer.mlp_out_eps);
      add_into(x, mlp);
    }
    return tr::rms_norm(x, final_norm_, final_eps_);
  }

 private:
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  double final_eps_ = 0;
  int64_t heads_, kv_heads_;
  bool causal_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(tr_kernels, m) {
  m.class_<FusedStack>("FusedStack")
      .def(torch::init<c10::List<Optional>, std::vector<double>, int64_t, int64_t, std::vector<int64_t>,
                       std::vector<int64_t>, std::vector<double>, std::vector<double>, bool>())
      .def("step", &FusedStack::step);
}
