"""What every command shares: option types, one-line user errors, loading with a spinner."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.markup import escape
from rich.console import Console

from ..completion import complete_model
from ..core import TokenRecyclingDecoder, resolve_tree
from ..core.sampling import SamplingConfig, check_settings, ignored_generation_settings, wants_sampling
from ..errors import UserError
from ..hot_matrix import HotMatrix
from ..models import DEFAULT_MODEL, LoadedModel, load_model
from ..tuning import TreeChoice, build_decoder, tree_choice

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def _complete_model(incomplete: str) -> list[tuple[str, str]]:
    """Shell completion of MODEL: the packaged name, GGUF files, directories, cached hub ids."""
    return complete_model(incomplete, packaged=[DEFAULT_MODEL])


ModelArg = typer.Argument(
    None,
    help=f"Packaged model name ({DEFAULT_MODEL}), a .gguf file, a checkpoint directory or a cached Hugging Face id.",
    autocompletion=_complete_model,
)
DeviceOpt = typer.Option("auto", "--device", help="auto, cpu, cuda or mps.")
DtypeOpt = typer.Option("auto", "--dtype", help="auto (bf16 on CUDA and bf16-capable CPUs, else float32), float32, bfloat16, float16.")
TreeOpt = typer.Option("auto", "--tree", help="Draft tree: auto (designed for this device from its measured step cost and the matrix's acceptance statistics), paper (the paper's 80 nodes), none (no drafts), or a JSON spec file.")
LookupOpt = typer.Option(None, "--lookup", min=0, help="Prompt-lookup chain drafted beside the tree when the context's last words occurred before: its length (default 10 with --tree auto, else 0 = off).")
KOpt = typer.Option(8, "--k", min=1, help="Candidates kept per matrix row.")
MatrixPathOpt = typer.Option(None, "--matrix", help="Use this matrix file instead of the model's stored one.")
ColdOpt = typer.Option(False, "--cold", help="Start from an empty matrix (the stored one is not read).")
NoSaveOpt = typer.Option(False, "--no-save", help="Do not write the matrix back at exit.")
TemperatureOpt = typer.Option(None, "--temperature", help="Sample at this temperature (0 = greedy, the default). Sampling is lossless: the same distribution as transformers' generate(do_sample=True).")
TopPOpt = typer.Option(None, "--top-p", help="Sample from the smallest set of likeliest tokens holding this probability (default: the model's generation config, else 1.0 = off). Turns sampling on.")
TopKOpt = typer.Option(None, "--top-k", help="Sample from the K likeliest tokens (0 = off; default: the model's generation config, else 50 as in transformers). Turns sampling on.")
RepetitionPenaltyOpt = typer.Option(None, "--repetition-penalty", help="Penalize tokens already in the conversation (>1; default: the model's generation config, else 1.0). Turns sampling on.")
SamplingSeedOpt = typer.Option(None, "--seed", help="Seed of the sampler: the same seed on the same device gives the same tokens (default: random).")


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; the caller raises the returned Exit (code 1)."""
    stderr.print(f"[bold red]tr: error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(1)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes become one line and exit 1; Ctrl-C exits 130 quietly."""
    try:
        yield
    except UserError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        stderr.print("interrupted")
        raise typer.Exit(130) from None


def load_with_progress(model: str | None, device: str, dtype: str) -> LoadedModel:
    """Load the model while a spinner on stderr says what is happening."""
    if not sys.stderr.isatty():
        return load_model(model, device, dtype, status=lambda message: stderr.print(f"[dim]{escape(message)}…[/]"))
    with stderr.status("Resolving model…") as spinner:
        return load_model(model, device, dtype, status=lambda message: spinner.update(f"{escape(message)}…"))


def tree_option(tree: str, k: int, lookup: int | None = None) -> TreeChoice:
    """--tree (and --lookup) resolved and checked against --k, before any model loads."""
    spec = None
    if tree != "auto":
        try:
            spec = resolve_tree(tree)
        except ValueError as exc:
            raise UserError(f"{exc}; or --tree auto") from None
        if spec.max_slot >= k:
            raise UserError(f"--k {k}: tree {spec.name} uses candidate slot {spec.max_slot}; use --k {spec.max_slot + 1} or more")
    try:
        return tree_choice(spec, lookup)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def make_decoder(loaded: LoadedModel, hot: HotMatrix, choice: TreeChoice, **kwargs) -> TokenRecyclingDecoder:
    """The decoder for --tree: `auto` reads this device's t(N) calibration, measuring it (a few
    seconds, once per model and device) when missing, and learns with the matrix's statistics."""
    def status(message: str) -> None:
        stderr.print(f"[dim]{escape(message)}…[/]")

    return build_decoder(loaded.model, hot.matrix, choice, loaded.model_id, stats=hot.stats, status=status, **kwargs)


def tree_summary(decoder: TokenRecyclingDecoder) -> str:
    """e.g. 'tree auto23 (23 nodes, designed for this device) + lookup chain 10'."""
    tree = decoder.tree
    how = ", designed for this device" if decoder.auto else ""
    text = f"tree {tree.name} ({tree.size} nodes{how})"
    return text + (f" + lookup chain {decoder.lookup_length}" if decoder.lookup_length else "")


def open_matrix(loaded: LoadedModel, k: int, path: Path | None, cold: bool, no_save: bool) -> HotMatrix:
    """The model's hot matrix (or the one named by --matrix, or an empty one with --cold)."""
    if path is not None and path.exists() and not path.is_file():
        raise UserError(f"--matrix {path}: not a file")
    return HotMatrix.open(loaded.tokenizer, loaded.vocab_size, loaded.model_id, k=k, device=loaded.device,
                          path=path, cold=cold, save=not no_save)


def save_matrix(hot: HotMatrix) -> None:
    """Save at exit; a failure is a warning, never a lost result."""
    try:
        rows = hot.save()
    except (OSError, UserError) as exc:
        stderr.print(f"[yellow]tr: warning:[/] could not save the matrix to {escape(f'{hot.path}: {exc}')}")
        return
    if rows:
        stderr.print(f"[dim]matrix: {rows:,} rows saved to {escape(str(hot.path))}[/]")


def sampling_request(
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    repetition_penalty: float | None,
    seed: int | None,
) -> dict | None:
    """The sampling options as given, checked before any model loads; None means greedy.

    Sampling is on with --temperature above 0, or with --top-p/--top-k/--repetition-penalty and no
    --temperature (the model's temperature then, else 1.0). --temperature 0 is greedy.
    """
    problem = check_settings(temperature, top_k, top_p, repetition_penalty, seed)
    if problem:
        flag = problem.split(" ", 1)[0].replace("_", "-")
        raise UserError(f"--{flag}{problem[len(flag):]}")
    others = {"--top-p": top_p, "--top-k": top_k, "--repetition-penalty": repetition_penalty}
    given = [name for name, value in others.items() if value is not None]
    if temperature == 0 and given:
        raise UserError(f"{given[0]} needs sampling, but --temperature 0 is greedy decoding; drop one of them")
    if not wants_sampling(temperature, top_p, top_k, repetition_penalty):
        return None
    return {"temperature": temperature, "top_p": top_p, "top_k": top_k, "repetition_penalty": repetition_penalty,
            "seed": seed}


def sampling_config(request: dict | None, loaded: LoadedModel) -> SamplingConfig:
    """The request merged with the model's generation config (and transformers' defaults), as
    generate(do_sample=True) would merge them; says which of the model's settings tr cannot apply."""
    if request is None:
        return SamplingConfig.greedy()
    generation_config = getattr(loaded.model, "generation_config", None)
    ignored = ignored_generation_settings(generation_config)
    if ignored:
        stderr.print(f"[yellow]tr: warning:[/] the model's generation config sets {escape(', '.join(ignored))}, "
                     "which tr does not apply when sampling")
    return SamplingConfig.resolve(generation_config, **request)
