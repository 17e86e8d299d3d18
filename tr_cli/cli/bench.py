"""`tr bench`: baseline vs prompt lookup vs Token Recycling on a prompt file, one process."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
import typer
from rich.markup import escape
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..bench.distribution import check_tokens
from ..bench.methods import HFGenerate, TokenRecycling, parse_methods, variant_tree
from ..bench.metrics import summarize
from ..bench.report import FORMATS, environment, render, to_rich_table
from ..bench.runner import run_bench
from ..errors import UserError
from ..models import device_name
from ..prompts import SAMPLE, load_prompts, select_prompts
from ..text import encode_conversation
from .common import (
    ColdOpt,
    DeviceOpt,
    DtypeOpt,
    KOpt,
    LookupOpt,
    MatrixPathOpt,
    NoSaveOpt,
    RepetitionPenaltyOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
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


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def bench(
    prompts_file: str = typer.Argument(SAMPLE, metavar="[PROMPTS]", help="Spec-Bench JSONL, JSONL with \"prompt\", or plain text (blank-line separated). Default: the bundled sample."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model (default: the packaged smollm2)."),
    methods: str = typer.Option("baseline,pld,tr", "--methods", help="Comma-separated: baseline (HF generate), pld (HF prompt lookup), ar (tr's own forward, one token per step: what speculation alone adds), tr (with --tree/--lookup), tr:TREE variants on a copy of the matrix (e.g. tr:paper, tr:auto+lookup0)."),
    tree: str = TreeOpt,
    lookup: int | None = LookupOpt,
    k: int = KOpt,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", min=1),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N prompts (after --categories)."),
    per_category: int | None = typer.Option(None, "--per-category", min=1, help="Use only the first N prompts of each category."),
    categories: str | None = typer.Option(None, "--categories", help="Comma-separated categories to keep."),
    turns: str = typer.Option("all", "--turns", help="1 (first turn only) or all (each next turn after the method's own answer)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Prompts run first and not counted."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Runs per measurement; the median time is reported."),
    matrix: Path | None = MatrixPathOpt,
    cold: bool = ColdOpt,
    no_save: bool = NoSaveOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    fmt: str = typer.Option("table", "--format", help="table, md, csv or json."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report here instead of stdout."),
    temperature: float | None = TemperatureOpt,
    top_p: float | None = TopPOpt,
    top_k: int | None = TopKOpt,
    repetition_penalty: float | None = RepetitionPenaltyOpt,
    seed: int = typer.Option(0, "--seed", help="Seed of every method's sampling (greedy decoding does not depend on it)."),
) -> None:
    """Benchmark Token Recycling against transformers generate (greedy, or sampling with --temperature) and prompt lookup decoding."""
    with user_errors():
        try:
            chosen = parse_methods(_split(methods))
            variant_args = {name: variant_tree(name) for name in chosen if name.startswith("tr:")}
        except ValueError as exc:
            raise UserError(str(exc)) from None
        variants = {name: tree_option(variant, k, length) for name, (variant, length) in variant_args.items()}
        if "ar" in chosen:
            variants["ar"] = tree_option("none", k, 0)
        if fmt not in FORMATS:
            raise UserError(f"--format {fmt}: choose table, md, csv or json")
        if turns not in ("1", "all"):
            raise UserError(f"--turns {turns}: use 1 or all")
        if output is not None and not output.parent.is_dir():
            raise UserError(f"--output {output}: directory {output.parent} does not exist")
        choice = tree_option(tree, k, lookup)
        request = sampling_request(temperature, top_p, top_k, repetition_penalty, seed)
        records = select_prompts(load_prompts(prompts_file), _split(categories or ""), per_category, limit, str(prompts_file))
        if not records:
            raise UserError(f"{prompts_file}: no prompts left to run")

        loaded = load_with_progress(model, device, dtype)
        sampling = sampling_config(request, loaded)
        torch.manual_seed(seed)  # transformers' sampling draws from torch's global generator
        tok = loaded.tokenizer
        decoding = [name for name in chosen if name == "tr" or name in variants]
        hot = open_matrix(loaded, k, matrix, cold, no_save) if decoding else None
        runners, trees = {}, {}
        for name in chosen:
            if name == "tr":
                decoder = make_decoder(loaded, hot, choice, sampling=sampling)
            elif name in variants:
                # Variants learn on copies, so they neither help one another nor change the store.
                twin = replace(hot, matrix=hot.matrix.clone(), stats=hot.stats.copy(), save_enabled=False)
                decoder = make_decoder(loaded, twin, variants[name], sampling=sampling)
            if name in decoding:
                runners[name] = TokenRecycling(decoder, loaded.eos_token_ids).run
                trees[name] = tree_summary(decoder)
            else:
                runners[name] = HFGenerate(loaded.model, loaded.eos_token_ids, prompt_lookup=name == "pld",
                                           sampling=sampling).run
        # Sampled outputs differ by chance: instead of comparing tokens, score each method's tokens
        # under the model's distribution (untimed; bench/distribution.py).
        check = None if sampling.is_greedy else (lambda ids, tokens: check_tokens(loaded.model, sampling, ids, tokens))
        env = environment(
            model=loaded.model_id, device=str(loaded.device), device_name=device_name(loaded.device),
            dtype=str(loaded.dtype).removeprefix("torch."), tree=trees.get("tr"), trees=trees or None, k=k,
            max_new_tokens=max_new_tokens, prompts_file=str(prompts_file), turns=turns, warmup=warmup, repeats=repeats,
            matrix=hot.describe() if hot else "unused", matrix_updates_at_start=hot.start_update_count if hot else None,
            methods=chosen, decoding=sampling.describe(), seed=None if sampling.is_greedy else seed,
        )
        if hot:
            stderr.print(f"[dim]{escape(hot.describe())}[/]")
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=stderr, transient=True) as bar:
                task = bar.add_task("warming up", total=len(records))

                def progress(index: int, method: str, speedups: dict[str, float]) -> None:
                    so_far = " ".join(f"{m} {s:.2f}×" for m, s in speedups.items())
                    label = f"prompt {min(index + 1, len(records))}/{len(records)} · {method}" if method else "done"
                    bar.update(task, completed=index, description=f"{label} · {so_far}" if so_far else label)

                results = run_bench(
                    runners, records,
                    encode=lambda history, text: encode_conversation(tok, history, text),
                    decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                    max_new_tokens=max_new_tokens, turns=turns, repeats=repeats, warmup=warmup, progress=progress,
                    check=check,
                )
        finally:
            if hot:
                save_matrix(hot)
        report = summarize(results, env, sampled=not sampling.is_greedy)
        if fmt == "table":
            # A pipe or file has no width: give the table room instead of Rich's 80 columns.
            if output:
                with output.open("w") as f:
                    Console(file=f, width=220, highlight=False).print(to_rich_table(report))
            else:
                wide = None if sys.stdout.isatty() else 220
                Console(highlight=False, width=wide).print(to_rich_table(report))
        else:
            text = render(report, fmt)
            if output:
                output.write_text(text)
            else:
                typer.echo(text, nl=False)
        if output:
            stderr.print(f"report written to {escape(str(output))}")
