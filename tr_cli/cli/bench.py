"""`tr bench`: baseline vs prompt lookup vs Token Recycling on a prompt file, one process."""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..bench.plot import check_plot_target, read_reports
from ..bench.report import FORMATS, target_problem
from ..engine.options import DecodingOptions
from ..errors import UserError, first_line
from ..text.conversation import ConversationEncoder
from ..text.prompts import SAMPLE, PromptRecord, load_prompts, select_prompts
from .console import note, progress_bar, warn
from .options import decoding_options

if TYPE_CHECKING:  # the methods, the report's versions and the engine import torch: when a bench runs
    from ..bench.methods import Method
    from ..engine.engine import Engine

PIPED_WIDTH = 220  # a pipe or file has no width: give the table room instead of Rich's 80 columns

PromptsFile = Annotated[
    str,
    typer.Argument(
        metavar="[PROMPTS]",
        help='Spec-Bench JSONL, JSONL with "prompt", or plain text (blank-line separated). '
        "Default: the bundled sample.",
    ),
]
Methods = Annotated[
    str,
    typer.Option(
        "--methods",
        help="Comma-separated: baseline (HF generate), pld (HF prompt lookup), ar (tr's own forward, one "
        "token per step: what speculation alone adds), tr (with --tree/--lookup), tr:TREE variants on a copy of the "
        "matrix (e.g. tr:paper, tr:auto+lookup0). Any of them @int8, @int4, @int8+bf16 or @int4+bf16 (see --weights): "
        "on a quantized copy of the model (bfloat16), compared with baseline on the same weights; or @bf16: on the "
        "model file loaded again, dense bfloat16 (baseline@bf16: transformers as most people run it; without "
        "baseline, speedups are over it).",
    ),
]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="Use only the first N prompts (after --categories).")]
PerCategory = Annotated[
    int | None, typer.Option("--per-category", min=1, help="Use only the first N prompts of each category.")
]
Categories = Annotated[str | None, typer.Option("--categories", help="Comma-separated categories to keep.")]
Turns = Annotated[
    str, typer.Option("--turns", help="1 (first turn only) or all (each next turn after the method's own answer).")
]
Warmup = Annotated[int, typer.Option("--warmup", min=0, help="Prompts run first and not counted.")]
Repeats = Annotated[int, typer.Option("--repeats", min=1, help="Runs per measurement; the median time is reported.")]
Passes = Annotated[
    int,
    typer.Option(
        "--passes",
        min=1,
        help="Run the prompts this many times, learning carried over (a repeated workload); each pass "
        "is reported on its own.",
    ),
]
Format = Annotated[str, typer.Option("--format", help="table, md, csv or json.")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write the report here instead of stdout.")]
Plot = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Also draw the report (.png, .svg or .pdf): tokens/s per method and category with speedups, "
        "tokens per step, tokens/s per prompt. Needs the extra tr-cli[plot] (matplotlib). With several "
        "passes, one file per pass (NAME-passN).",
    ),
]
FromReport = Annotated[
    Path | None,
    typer.Option(
        "--from-report",
        help="Run nothing: read a report written with --format json and print, write or --plot it again.",
    ),
]


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _select(
    prompts_file: str, categories: str | None, per_category: int | None, limit: int | None
) -> list[PromptRecord]:
    records = select_prompts(
        load_prompts(prompts_file), _split(categories or ""), per_category, limit, str(prompts_file)
    )
    if not records:
        raise UserError(f"{prompts_file}: no prompts left to run")
    return records


@decoding_options(model_as_option=True)
def bench(
    prompts_file: PromptsFile = SAMPLE,
    methods: Methods = "baseline,pld,tr",
    limit: Limit = None,
    per_category: PerCategory = None,
    categories: Categories = None,
    turns: Turns = "all",
    warmup: Warmup = 1,
    repeats: Repeats = 1,
    passes: Passes = 1,
    fmt: Format = "table",
    output: Output = None,
    plot: Plot = None,
    from_report: FromReport = None,
    *,
    options: DecodingOptions,
) -> None:
    """Benchmark Token Recycling against transformers generate (greedy, or sampling with --temperature)
    and prompt lookup decoding."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: choose table, md, csv or json")
    _check_output(output)
    if plot is not None:
        check_plot_target(plot)
    if from_report is not None:  # nothing runs, nothing loads
        reports = read_reports(from_report)
        _write(reports, fmt, output)
        _plot(reports, plot)
        return
    import torch

    from ..bench.distribution import check_tokens
    from ..bench.llama_cpp import llama_cpp_version
    from ..bench.methods import check_device, make_runners, model_of, parse_methods, variant_loads
    from ..bench.metrics import summarize
    from .setup import open_engine, save_state

    chosen = parse_methods(_split(methods), options.drafts, options.k)
    check_device(chosen, options.runtime.device)
    if turns not in ("1", "all"):
        raise UserError(f"--turns {turns}: use 1 or all")
    records = _select(prompts_file, categories, per_category, limit)
    structured = any(record.schema is not None for record in records)
    # llama.cpp is compared on free text only; transformers' prompt lookup runs logits processors
    # on draft positions, which a grammar that follows the text cannot undo.
    others = [method.name for method in chosen if method.llama_cpp or method.prompt_lookup]
    if structured and others:
        raise UserError(
            f"{prompts_file}: prompts with a schema run on generate, ar and tr only; drop {', '.join(others)}"
        )
    # Every method samples from one seeded stream (greedy decoding does not depend on it).
    seed = options.sampling.seed if options.sampling.seed is not None else 0
    options = replace(options, sampling=replace(options.sampling, seed=seed))
    max_new_tokens = options.max_new_tokens

    decoding = any(method.plan is not None for method in chosen)
    engine = open_engine(options, matrix=decoding, decoder=any(method.on_engine_decoder for method in chosen))
    encoder = ConversationEncoder(engine.loaded.tokenizer)
    if structured and not engine.sampling.is_greedy:
        raise UserError(f"{prompts_file}: prompts with a schema are benchmarked greedy; drop the sampling settings")
    records, skipped = _fit_context(records, engine, encoder, max_new_tokens, turns, prompts_file)
    torch.manual_seed(seed)  # transformers' sampling draws from torch's global generator
    runners, drafts = make_runners(engine, chosen)
    by_name: dict[str, Method] = {method.name: method for method in chosen}
    sampling = engine.sampling

    # Sampled outputs differ by chance: instead of comparing tokens, score each method's tokens
    # under the model's distribution (untimed; bench/distribution.py).
    check = None
    if not sampling.is_greedy:
        check = lambda name, ids, tokens: check_tokens(model_of(engine, by_name[name]), sampling, ids, tokens)  # noqa: E731
    # How every prompt is run: recorded in the report and handed to run_bench as they are.
    schedule = {"max_new_tokens": max_new_tokens, "turns": turns, "repeats": repeats}
    env = _environment(
        engine,
        drafts,
        seed,
        methods=[method.name for method in chosen],
        variant_loads=variant_loads(engine, chosen),
        llama_cpp=llama_cpp_version([m.name for m in chosen]) if any(m.llama_cpp for m in chosen) else None,
        k=options.k,
        prompts_file=prompts_file,
        warmup=warmup,
        skipped=skipped,
        **schedule,
    )
    reports = []
    try:
        for number in range(1, passes + 1):
            if passes > 1:
                env = {**env, "pass": f"{number} of {passes}"}
            if number > 1:
                env["matrix"] = f"warmed on the same prompts by pass {number - 1} (a repeated workload)"
            # Warm-up prompts only before the first pass: later passes start warm by design.
            first = warmup if number == 1 else 0
            results = _run(runners, records, encoder, check, warmup=first, **schedule)
            reports.append(summarize(results, env, sampled=not sampling.is_greedy))
    finally:
        save_state(engine)
    _write(reports, fmt, output)
    _plot(reports, plot)


def _plot(reports: list[dict], plot: Path | None) -> None:
    """Each pass's figure: `plot` itself for one pass, NAME-passN.SUFFIX for several."""
    if plot is None:
        return
    from ..bench.plot import plot_report

    for number, report in enumerate(reports, start=1):
        several = len(reports) > 1
        path = plot.with_name(f"{plot.stem}-pass{number}{plot.suffix}") if several else plot
        plot_report(report, path, f"pass {number} of {len(reports)}" if several else "")
        note(f"plot written to {path}")


def _check_output(output: Path | None) -> None:
    """Refuse an --output the report cannot be written to before the run, not after it."""
    if output is None:
        return
    problem = target_problem(output)
    if problem is not None:
        raise UserError(f"--output {output}: {problem}")


def _fit_context(
    records: list[PromptRecord],
    engine: Engine,
    encoder: ConversationEncoder,
    max_new_tokens: int,
    turns: str,
    prompts_file: Path,
) -> tuple[list[PromptRecord], str | None]:
    """The prompts the model's context holds, and what was skipped (for the report); each
    skipped prompt is a warning."""
    from ..bench.runner import conversation_turns, over_context
    from ..core.decode import CONSTRAINED_DEPTH

    context = engine.loaded.context_length
    max_depth = engine.decoder.max_depth if engine.decoder is not None else 0
    if any(record.schema is not None for record in records):
        max_depth = max(max_depth, CONSTRAINED_DEPTH)  # the grammar's drafts and text lookup
    over = over_context(records, conversation_turns(encoder), max_new_tokens, turns, context, max_depth)
    if not over:
        return records, None
    for record, needed in over:
        warn(
            f"{prompts_file}: prompt {record.id} skipped: it needs {needed:,} positions with "
            f"--max-new-tokens {max_new_tokens}, the model's context holds {context:,}"
        )
    skipped = [record for record, _ in over]
    kept = [record for record in records if record not in skipped]
    if not kept:
        raise UserError(
            f"{prompts_file}: no prompt fits the model's context of {context:,} tokens; lower --max-new-tokens"
        )
    return kept, f"{len(skipped)} over the context ({', '.join(record.id for record in skipped)})"


def _environment(engine: Engine, drafts: dict[str, str], seed: int, **run) -> dict:
    """The circumstances recorded with the numbers: versions, machine, model, drafts, matrix state."""
    from ..bench.report import environment
    from ..models.cpu import cpu_isa
    from ..models.device import device_name

    loaded, hot, sampling = engine.loaded, engine.hot, engine.sampling
    return environment(
        model=loaded.model_id,
        device=str(loaded.runtime.device),
        device_name=device_name(loaded.runtime.device),
        cpu_isa=cpu_isa() if loaded.runtime.device.type == "cpu" else None,
        dtype=loaded.runtime.dtype_name,
        weights=loaded.runtime.weights.name,
        tree=drafts.get("tr"),
        trees=drafts or None,
        matrix=hot.describe() if hot else "unused",
        matrix_updates_at_start=hot.start_update_count if hot else None,
        decoding=sampling.describe(),
        seed=None if sampling.is_greedy else seed,
        **run,
    )


def _run(runners, records, encoder: ConversationEncoder, check, **schedule):
    """run_bench under a progress bar with the running speedups."""
    from ..bench.runner import conversation_turns, run_bench

    with progress_bar(TimeElapsedColumn()) as bar:
        task = bar.add_task("warming up", total=len(records))

        def progress(index: int, method: str, speedups: dict[str, float]) -> None:
            so_far = " ".join(f"{m} {s:.2f}×" for m, s in speedups.items())
            label = f"prompt {min(index + 1, len(records))}/{len(records)} · {method}" if method else "done"
            bar.update(task, completed=index, description=f"{label} · {so_far}" if so_far else label)

        return run_bench(
            runners,
            records,
            encode=conversation_turns(encoder),
            decode=lambda ids: encoder.tokenizer.decode(ids, skip_special_tokens=True),
            progress=progress,
            check=check,
            **schedule,
        )


def rich_table(report: dict) -> Table:
    """The report as a terminal table (the rows of report.rows, the environment as caption)."""
    from ..bench.report import environment_line, rows, sampled, sources_line

    header, body = rows(report)
    env = report["environment"]
    # An older report has no speedup_over: its speedups are over `baseline`.
    reference = env.get("speedup_over", "baseline")
    over = f"transformers {'sampling' if sampled(report) else 'greedy'}"
    over += "" if reference == "baseline" else f" ({reference})"
    number = env.get("pass")
    table = Table(
        title=(f"tr bench: speedup over {over}" if reference else "tr bench") + (f" · pass {number}" if number else ""),
        title_justify="left",
        caption="\n".join(line for line in (environment_line(env), sources_line(report)) if line),
        caption_justify="left",
    )
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    table.add_column("", justify="left", no_wrap=True)  # tok/s again, as bars to compare at a glance
    rates = [m["tokens_per_second"] for m in report["methods"].values()]
    for row, rate in zip(body, rates, strict=True):
        table.add_row(*(Text(cell) for cell in row), Text(_bar(rate, max(rates))))
    return table


def _bar(value: float, most: float, width: int = 16) -> str:
    """A bar of eighth-blocks, `width` cells at `most`."""
    eighths = round(8 * width * value / most) if most > 0 else 0
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def _write(reports: list[dict], fmt: str, output: Path | None) -> None:
    """The report on stdout or in `output`; a write that still fails (a full disk) prints it on
    stdout instead, so the measurements are never lost, and ends in an error."""
    from ..bench.report import render_passes

    if output is None:
        if fmt == "table":
            console = Console(highlight=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)
            for report in reports:
                console.print(rich_table(report))
        else:
            typer.echo(render_passes(reports, fmt), nl=False)
        return
    if fmt == "table":
        console = Console(file=io.StringIO(), width=PIPED_WIDTH, highlight=False)
        for report in reports:
            console.print(rich_table(report))
        text = console.file.getvalue()
    else:
        text = render_passes(reports, fmt)
    try:
        output.write_text(text)
    except OSError as exc:
        typer.echo(text, nl=False)
        raise UserError(
            f"--output {output}: the report could not be written ({first_line(exc)}); it was printed to stdout instead"
        ) from None
    note(f"report written to {output}")
