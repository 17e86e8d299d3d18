"""`tr generate`: one prompt, streamed Token Recycling output, then its stats."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import typer
from rich.markup import escape

from ..core import GenerationStats, StopCondition
from ..core.sampling import SamplingConfig
from ..prompts import sample_prompts
from ..text import IncrementalDecoder, encode_prompt
from .common import (
    ColdOpt,
    DeviceOpt,
    DtypeOpt,
    KOpt,
    LookupOpt,
    MatrixPathOpt,
    ModelArg,
    NoSaveOpt,
    RepetitionPenaltyOpt,
    SamplingSeedOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    fail,
    load_with_progress,
    make_decoder,
    open_matrix,
    sampling_config,
    sampling_request,
    save_matrix,
    tree_option,
    tree_summary,
    stderr,
    user_errors,
)


def generate(
    model: str | None = ModelArg,
    prompt: str | None = typer.Option(None, "--prompt", "-p", help="Prompt text ('-' reads stdin). Default: a bundled sample prompt."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", min=1, help="Generate at most this many tokens."),
    tree: str = TreeOpt,
    lookup: int | None = LookupOpt,
    k: int = KOpt,
    stop_strings: list[str] = typer.Option([], "--stop", help="Stop once the output contains this text (repeatable)."),
    compare: bool = typer.Option(False, "--compare", help="Also run transformers' generate with the same settings: speedup, and (greedy) the identical-output check."),
    temperature: float | None = TemperatureOpt,
    top_p: float | None = TopPOpt,
    top_k: int | None = TopKOpt,
    repetition_penalty: float | None = RepetitionPenaltyOpt,
    seed: int | None = SamplingSeedOpt,
    matrix: Path | None = MatrixPathOpt,
    cold: bool = ColdOpt,
    no_save: bool = NoSaveOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
) -> None:
    """Generate a reply to one prompt with Token Recycling and print its stats."""
    with user_errors():
        choice = tree_option(tree, k, lookup)
        request = sampling_request(temperature, top_p, top_k, repetition_penalty, seed)
        if prompt == "-":
            prompt = sys.stdin.read()
        if prompt is None:
            prompt = sample_prompts()[0].turns[0]
        if not prompt.strip():
            raise fail("--prompt is empty; give some text")

        loaded = load_with_progress(model, device, dtype)
        input_ids = encode_prompt(loaded.tokenizer, prompt)
        stop = StopCondition.build(
            max_new_tokens, loaded.eos_token_ids, stop_strings,
            decode=lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True),
        )
        sampling = sampling_config(request, loaded)
        hot = open_matrix(loaded, k, matrix, cold, no_save)
        decoder = make_decoder(loaded, hot, choice, sampling=sampling)

        stderr.print(f"[dim]{escape(loaded.model_id)} · {str(loaded.dtype).removeprefix('torch.')} · {loaded.device} · {escape(tree_summary(decoder))} · {torch.get_num_threads()} threads · {escape(sampling.describe())}[/]")
        stderr.print(f"[dim]{escape(hot.describe())}[/]")
        stderr.print(f"[bold]Prompt:[/] {escape(prompt.strip())}", markup=True, highlight=False)
        text = IncrementalDecoder(loaded.tokenizer)
        tokens: list[int] = []
        stats = GenerationStats(prompt_tokens=len(input_ids))
        start = time.perf_counter()
        try:
            for event in decoder.steps(input_ids, stop):
                stats.add(event)
                tokens.extend(event.new_tokens)
                sys.stdout.write(text.push(event.new_tokens))
                sys.stdout.flush()
        finally:
            save_matrix(hot)  # also on Ctrl-C: what was learned so far is kept
        stats.wall_seconds = time.perf_counter() - start
        sys.stdout.write("\n")

        steps = max(stats.steps, 1)
        stderr.print(
            f"[dim]{stats.new_tokens} tokens in {stats.wall_seconds:.2f}s · {stats.tokens_per_second:.1f} tok/s · "
            f"MAT {stats.mean_accepted_tokens:.2f} over {stats.steps} steps · prefill {stats.prefill_seconds * 1e3:.0f} ms · "
            f"per step: draft {stats.draft_seconds / steps * 1e3:.1f} / forward {stats.forward_seconds / steps * 1e3:.1f} / "
            f"verify {stats.verify_seconds / steps * 1e3:.1f} / update {stats.update_seconds / steps * 1e3:.1f} ms "
            f"({stats.overhead_fraction:.1%} outside the forward) · finish: {stats.finish_reason}[/]"
        )
        if compare:
            _compare(loaded, input_ids, max_new_tokens, stop_strings, tokens, stats.tokens_per_second, sampling)


def _compare(loaded, input_ids: list[int], max_new_tokens: int, stop_strings: list[str], tokens: list[int], tr_tps: float,
             sampling: SamplingConfig) -> None:
    ids = torch.tensor([input_ids], device=loaded.device)
    pad = loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
    if not sampling.is_greedy:
        torch.manual_seed(sampling.seed if sampling.seed is not None else 0)
    with torch.inference_mode():
        start = time.perf_counter()
        extra = {"stop_strings": stop_strings, "tokenizer": loaded.tokenizer} if stop_strings else {}
        out = loaded.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, pad_token_id=pad,
            **sampling.generate_kwargs(), **extra
        )
        seconds = time.perf_counter() - start
    baseline = out[0, len(input_ids):].tolist()
    base_tps = len(baseline) / seconds if seconds > 0 else 0.0
    if sampling.is_greedy:
        same = "output identical" if baseline == tokens else f"output differs from token {_first_difference(baseline, tokens)}"
    else:  # two independent samples of the same distribution: nothing to compare token by token
        same = "sampled: outputs differ by chance (tr bench checks the distribution)"
    label = "greedy" if sampling.is_greedy else "sampling"
    stderr.print(
        f"[bold]transformers {label}:[/] {len(baseline)} tokens, {base_tps:.1f} tok/s · "
        f"[bold]Token Recycling speedup {tr_tps / base_tps if base_tps else 0:.2f}×[/] · {same}"
    )


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
