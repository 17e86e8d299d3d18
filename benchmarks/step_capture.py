"""Probes for capturing the decoding step with torch.compile on this CPU (measure before building).

    python benchmarks/step_capture.py head [--autotune]    # the output head's int8 matmul per row count
    python benchmarks/step_capture.py step [--weights int4] [--autotune] [--cpp-wrapper]

`head`: SmolLM2's head (49,152 x 576) as torch's int8 weight-only kernel (bf16 and float32
activations) against dense float32 and bf16 `F.linear`, for M = 1..16 rows; with --autotune also
the kernel lowered by inductor's max-autotune (its C++ GEMM templates).

`step`: the packaged model's whole decoding step (layers, head, top-8) written as one function
over a static KV buffer (new keys written at their positions, attention over the whole buffer
under a mask), eager against `torch.compile(fullgraph=True, dynamic=False)` with freezing, for
N = 1 and 4 new tokens over 300 cached; prints the compile time and whether the top-8 ids match.
A probe, not tr's forward: tr's own path (core/forward.py) grows its cache and slices it per step.
Never run it beside another heavy process.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from matmul_kernels import median_ms  # run as a script: benchmarks/ is on the path

CAPACITY, CACHED = 512, 300


def _inductor(autotune: bool, cpp_wrapper: bool = False) -> None:
    import torch._inductor.config as config

    config.freezing = True
    config.cpp_wrapper = cpp_wrapper
    if autotune:
        config.max_autotune = True
        config.max_autotune_gemm_backends = "CPP,ATEN"


def head(autotune: bool) -> None:
    torch.manual_seed(0)
    weight = torch.randn(49152, 576) * 0.02
    scales = weight.abs().amax(1) / 127
    int8 = (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
    bf16_scales, bf16_weight = scales.bfloat16(), weight.bfloat16()
    for rows in (1, 2, 4, 8, 16):
        x = torch.randn(rows, 576)
        xb = x.bfloat16()
        times = {
            "int8 (bf16 act.)": median_ms(lambda xb=xb: torch.ops.aten._weight_int8pack_mm(xb, int8, bf16_scales)),
            "int8 (fp32 act.)": median_ms(lambda x=x: torch.ops.aten._weight_int8pack_mm(x, int8, scales)),
            "fp32 linear": median_ms(lambda x=x: F.linear(x, weight)),
            "bf16 linear": median_ms(lambda xb=xb: F.linear(xb, bf16_weight)),
        }
        print(f"M={rows:<3}", "  ".join(f"{k} {v:6.2f} ms" for k, v in times.items()), flush=True)
    if not autotune:
        return
    _inductor(autotune=True)

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", int8)
            self.register_buffer("scales", bf16_scales)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)

    module = Head().eval()
    for rows in (1, 4, 8):
        xb = torch.randn(rows, 576).bfloat16()
        compiled = torch.compile(module, dynamic=False)
        start = time.perf_counter()
        compiled(xb)
        took = time.perf_counter() - start
        ms = median_ms(lambda compiled=compiled, xb=xb: compiled(xb))
        print(f"compiled int8 head M={rows}: compile {took:.0f} s, {ms:.2f} ms", flush=True)


def step(weights: str, autotune: bool, cpp_wrapper: bool) -> None:
    import transformers.models.llama.modeling_llama as llama

    from tr_cli.core.forward import FUSED_GATE_UP, FUSED_QKV
    from tr_cli.models import Runtime, load_model
    from tr_cli.store.paths import cache_dir

    dtype = torch.float32 if weights == "dense" else torch.bfloat16
    runtime = Runtime.resolve("cpu", "float32" if weights == "dense" else "auto", weights)
    model = load_model(None, runtime, cache=cache_dir()).model
    body, config = model.model, model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    keys = [torch.zeros(1, kv_heads, CAPACITY, head_dim, dtype=dtype) for _ in body.layers]
    values = [torch.zeros(1, kv_heads, CAPACITY, head_dim, dtype=dtype) for _ in body.layers]

    def forward(ids, positions, mask, keys, values):
        n = ids.shape[0]
        hidden = body.embed_tokens(ids[None])
        cos, sin = body.rotary_emb(hidden, positions[None])
        for index, layer in enumerate(body.layers):
            attention, mlp = layer.self_attn, layer.mlp
            states = layer.input_layernorm(hidden)
            sizes = [attention.q_proj.out_features, attention.k_proj.out_features, attention.v_proj.out_features]
            fused = getattr(attention, FUSED_QKV, None)
            if fused is not None:
                q, k, v = fused(states).split(sizes, -1)
            else:
                q, k, v = attention.q_proj(states), attention.k_proj(states), attention.v_proj(states)
            q = q.view(1, n, heads, head_dim).transpose(1, 2)
            k = k.view(1, n, kv_heads, head_dim).transpose(1, 2)
            v = v.view(1, n, kv_heads, head_dim).transpose(1, 2)
            q, k = llama.apply_rotary_pos_emb(q, k, cos, sin)
            keys[index].index_copy_(2, positions, k.to(dtype))
            values[index].index_copy_(2, positions, v.to(dtype))
            groups = heads // kv_heads
            shape = (kv_heads, groups, CAPACITY, head_dim)
            out = F.scaled_dot_product_attention(
                q.reshape(kv_heads, groups, n, head_dim),
                keys[index].transpose(0, 1).expand(shape),
                values[index].transpose(0, 1).expand(shape),
                attn_mask=mask,
                scale=attention.scaling,
            )
            hidden = hidden + attention.o_proj(out.reshape(1, heads, n, head_dim).transpose(1, 2).reshape(1, n, -1))
            states = layer.post_attention_layernorm(hidden)
            fused = getattr(mlp, FUSED_GATE_UP, None)
            if fused is not None:
                gate, up = fused(states).split([mlp.gate_proj.out_features, mlp.up_proj.out_features], -1)
            else:
                gate, up = mlp.gate_proj(states), mlp.up_proj(states)
            hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        return torch.topk(model.lm_head(body.norm(hidden))[0], 8)

    def inputs(n: int):
        positions = torch.arange(n) + CACHED
        lowest = torch.finfo(dtype).min
        mask = torch.full((1, 1, n, CAPACITY), lowest, dtype=dtype)
        mask[..., :CACHED] = 0
        mask[0, 0, :, CACHED : CACHED + n] = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), 0.0, lowest)
        return torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)), positions, mask

    with torch.inference_mode():
        for n in (1, 4):
            args = inputs(n)
            ms = median_ms(lambda args=args: forward(*args, keys, values))
            print(f"{weights} eager N={n}: {ms:.1f} ms", flush=True)
        _inductor(autotune, cpp_wrapper)
        compiled = torch.compile(forward, fullgraph=True, dynamic=False)
        for n in (1, 4):
            args = inputs(n)
            start = time.perf_counter()
            reference, out = forward(*args, keys, values), compiled(*args, keys, values)
            took = time.perf_counter() - start
            same = torch.equal(reference.indices, out.indices)
            ms = median_ms(lambda args=args: compiled(*args, keys, values))
            print(f"{weights} compiled N={n}: compile {took:.0f} s, {ms:.1f} ms, same top-8 ids: {same}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("head", "step"))
    parser.add_argument("--weights", default="int4", help="dense (float32), int8 or int4")
    parser.add_argument("--autotune", action="store_true", help="inductor max-autotune (C++ GEMM templates)")
    parser.add_argument("--cpp-wrapper", action="store_true")
    args = parser.parse_args()
    print(f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.what == "head":
        head(args.autotune)
    else:
        step(args.weights, args.autotune, args.cpp_wrapper)


if __name__ == "__main__":
    main()
