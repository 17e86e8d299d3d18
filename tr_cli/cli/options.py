"""The options the decoding commands share, declared once (Annotated aliases), and their parsing
into the engine's plain values: checked before any model loads, errors naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core import InvalidTree, resolve_tree
from ..core.sampling_config import SamplingRequest, check_settings
from ..engine.choices import EngineOptions, TreeChoice
from ..errors import UserError
from ..models import DEFAULT_MODEL
from ..models.device import pick_device, pick_dtype
from ..models.weights import check_weights
from .completion import complete_model


def _complete_model(incomplete: str) -> list[tuple[str, str]]:
    """Shell completion of MODEL: the packaged name, GGUF files, directories, cached hub ids."""
    return complete_model(incomplete, packaged=[DEFAULT_MODEL])


_MODEL_HELP = (
    f"Packaged model name ({DEFAULT_MODEL}), a .gguf file, a checkpoint directory or a cached Hugging Face id."
)

ModelArgument = Annotated[str | None, typer.Argument(help=_MODEL_HELP, autocompletion=_complete_model)]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or mps.")]
Dtype = Annotated[
    str,
    typer.Option(
        "--dtype", help="auto (bf16 on CUDA and bf16-capable CPUs, else float32), float32, bfloat16, float16."
    ),
]
Weights = Annotated[
    str,
    typer.Option(
        "--weights",
        help="dense (the model's weights in --dtype), or int8 / int4: weight-only quantized matmuls on the CPU "
        "(bfloat16 activations; --compare runs generate on the same quantized model); int8+bf16 / int4+bf16 "
        "also keep the bfloat16 weights for prompts (about 2x faster prompt processing, more memory).",
    ),
]
Tree = Annotated[
    str,
    typer.Option(
        "--tree",
        help="Draft tree: auto (designed for this device from its measured step cost and the matrix's "
        "acceptance statistics), paper (the paper's 80 nodes), none (no drafts), or a JSON spec file.",
    ),
]
Lookup = Annotated[
    int | None,
    typer.Option(
        "--lookup",
        min=0,
        help="Prompt-lookup chain drafted beside the tree when the context's last words occurred "
        "before: its length (default 10 with --tree auto, else 0 = off).",
    ),
]
K = Annotated[int, typer.Option("--k", min=1, help="Candidates kept per matrix row.")]
MatrixPath = Annotated[
    Path | None, typer.Option("--matrix", help="Use this matrix file instead of the model's stored one.")
]
Cold = Annotated[bool, typer.Option("--cold", help="Start from an empty matrix (the stored one is not read).")]
NoSave = Annotated[bool, typer.Option("--no-save", help="Do not write the matrix back at exit.")]
Temperature = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        help="Sample at this temperature (0 = greedy, the default). Sampling is lossless: the same "
        "distribution as transformers' generate(do_sample=True).",
    ),
]
TopP = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help="Sample from the smallest set of likeliest tokens holding this probability (default: the "
        "model's generation config, else 1.0 = off). Turns sampling on.",
    ),
]
TopK = Annotated[
    int | None,
    typer.Option(
        "--top-k",
        help="Sample from the K likeliest tokens (0 = off; default: the model's generation config, else 50 "
        "as in transformers). Turns sampling on.",
    ),
]
RepetitionPenalty = Annotated[
    float | None,
    typer.Option(
        "--repetition-penalty",
        help="Penalize tokens already in the conversation (>1; default: the model's "
        "generation config, else 1.0). Turns sampling on.",
    ),
]
Seed = Annotated[
    int | None,
    typer.Option(
        "--seed", help="Seed of the sampler: the same seed on the same device gives the same tokens (default: random)."
    ),
]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Generate at most this many tokens.")]


# Sane bounds, checked before anything is allocated: the matrix is |V| x k ids (k = 100,000 asked
# for 19.7 GB on a 49k vocabulary), and a lookup draft of N tokens is verified in one forward.
MAX_K = 64
MAX_LOOKUP = 64


def tree_choice(tree: str, k: int, lookup: int | None = None) -> TreeChoice:
    """--tree (and --lookup) resolved and checked against --k."""
    if k > MAX_K:
        raise UserError(f"--k {k}: at most {MAX_K} candidates per matrix row (the paper keeps 8)")
    if lookup is not None and lookup > MAX_LOOKUP:
        raise UserError(f"--lookup {lookup}: at most {MAX_LOOKUP} tokens deep (default 10)")
    spec = None
    if tree != "auto":
        try:
            spec = resolve_tree(tree)
        except InvalidTree as exc:
            raise UserError(f"--tree {exc}; or --tree auto") from None
        if spec.max_slot >= k:
            raise UserError(
                f"--k {k}: tree {spec.name} uses candidate slot {spec.max_slot}; use --k {spec.max_slot + 1} or more"
            )
    try:
        return TreeChoice.of(spec, lookup)
    except ValueError as exc:
        raise UserError(f"--lookup {lookup}: {exc}") from None


def sampling_request(
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    repetition_penalty: float | None,
    seed: int | None,
) -> SamplingRequest | None:
    """The sampling options as given; None means greedy.

    Sampling is on with --temperature above 0, or with --top-p/--top-k/--repetition-penalty and no
    --temperature (the model's temperature then, else 1.0). --temperature 0 is greedy.
    """
    problem = check_settings(temperature, top_k, top_p, repetition_penalty, seed)
    if problem:
        flag = problem.split(" ", 1)[0].replace("_", "-")
        raise UserError(f"--{flag}{problem[len(flag) :]}")
    others = {"--top-p": top_p, "--top-k": top_k, "--repetition-penalty": repetition_penalty}
    given = [name for name, value in others.items() if value is not None]
    if temperature == 0 and given:
        raise UserError(f"{given[0]} needs sampling, but --temperature 0 is greedy decoding; drop one of them")
    request = SamplingRequest(temperature, top_p, top_k, repetition_penalty, seed)
    return request if request.wants_sampling else None


def engine_options(
    *,
    model: str | None,
    device: str,
    dtype: str,
    weights: str = "dense",
    tree: str,
    lookup: int | None,
    k: int,
    matrix: Path | None,
    cold: bool,
    no_save: bool,
    sampling: SamplingRequest | None,
) -> EngineOptions:
    """The shared options as the engine takes them, checked before any model loads."""
    if model is not None and not model.strip():
        raise UserError("MODEL is empty; leave it out for the packaged model, or name one")
    if matrix is not None and matrix.exists() and not matrix.is_file():
        raise UserError(f"--matrix {matrix}: not a file")
    torch_device = pick_device(device)
    check_weights(weights, torch_device, None if dtype == "auto" else pick_dtype(dtype, torch_device))
    return EngineOptions(
        model=model,
        device=device,
        dtype=dtype,
        weights=weights,
        tree=tree_choice(tree, k, lookup),
        k=k,
        matrix=matrix,
        cold=cold,
        save=not no_save,
        sampling=sampling,
    )
