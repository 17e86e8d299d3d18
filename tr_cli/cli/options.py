"""The decoding options every decoding command takes, declared once.

`@decoding_options` gives a command the shared Typer parameters (model, device, dtype, weights,
tree, lookup, k, matrix, cold, no-save, the sampling settings, max-new-tokens) and hands it one
checked `DecodingOptions` (engine/options.py) as its `options` argument, parsed before any model
loads. A new decoding flag: a field of DecodingOptions, its declaration in DECODING_PARAMETERS.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from ..core.drafters.plan import SOURCES
from ..core.matrix_width import DEFAULT_K
from ..engine.options import DEFAULT_MAX_NEW_TOKENS, DecodingOptions
from ..errors import UserError
from ..models import DEFAULT_MODEL
from ..models.weights_mode import AUTO, WEIGHTS_NAMES
from .completion import complete_model


def complete_models(incomplete: str) -> list[tuple[str, str]]:
    """Shell completion of MODEL: the packaged name, GGUF files, directories, cached hub ids."""
    return complete_model(incomplete, packaged=[DEFAULT_MODEL])


_MODEL_HELP = (
    f"Packaged model name ({DEFAULT_MODEL}), a .gguf file, a checkpoint directory or a cached Hugging Face id."
)

ModelArgument = Annotated[str | None, typer.Argument(help=_MODEL_HELP, autocompletion=complete_models)]
# Every command that takes a model takes it as -m/--model too (as other tools do), beside the
# positional MODEL where there is one; a command whose argument is something else (tr bench's
# PROMPTS) takes the option alone.
ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help=_MODEL_HELP, autocompletion=complete_models, show_default=False)
]
_SAME_AS_MODEL = "The model, as the MODEL argument (give one of the two)."
ModelFlag = Annotated[
    str | None,
    typer.Option("--model", "-m", help=_SAME_AS_MODEL, autocompletion=complete_models, show_default=False),
]


def one_model(argument: str | None, option: str | None) -> str | None:
    """The model a command was given, as its MODEL argument or its -m/--model option; both given
    and different is a UserError (which one was meant?)."""
    if argument is not None and option is not None and argument != option:
        raise UserError(f"MODEL {argument} and --model {option}: two models; give one")
    return argument if argument is not None else option


K = Annotated[int, typer.Option("--k", min=1, help="Candidates kept per matrix row.")]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or mps.")]
Dtype = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="auto (bf16 on CUDA and bf16-capable CPUs, else float32), float32, bfloat16, float16.",
    ),
]
_SOURCE_NAMES = ", ".join(f"+{name}N" for name in SOURCES)


def _parameter(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


# The shared parameters, in the order --help lists them; names are DecodingOptions.parse's.
DECODING_PARAMETERS = (
    _parameter(
        "max_new_tokens",
        Annotated[
            int,
            typer.Option(
                "--max-new-tokens",
                "-n",
                min=1,
                help="Longest reply, in tokens (tr serve: when a request sets no max_tokens).",
            ),
        ],
        DEFAULT_MAX_NEW_TOKENS,
    ),
    _parameter(
        "tree",
        Annotated[
            str,
            typer.Option(
                "--tree",
                help="Draft tree: auto (designed for this device from its measured step cost and the matrix's "
                "acceptance statistics), paper (the paper's 80 nodes), none (no drafts), or a JSON spec file; "
                f"then draft sources beside it ({_SOURCE_NAMES}: depth N, 0 = off), e.g. auto+store0 or "
                "paper+lookup10. auto drafts every source by default, a fixed tree only those named.",
            ),
        ],
        "auto",
    ),
    _parameter(
        "lookup",
        Annotated[
            int | None,
            typer.Option(
                "--lookup",
                min=0,
                help="Prompt lookup drafted beside the tree when the context's last words occurred before: "
                "how deep (default 10 with --tree auto, else 0 = off). Short for --tree TREE+lookupN.",
            ),
        ],
        None,
    ),
    _parameter("k", K, DEFAULT_K),
    _parameter(
        "temperature",
        Annotated[
            float | None,
            typer.Option(
                "--temperature",
                help="Sample at this temperature (0 = greedy, the default). Sampling is lossless: the same "
                "distribution as transformers' generate(do_sample=True).",
            ),
        ],
        None,
    ),
    _parameter(
        "top_p",
        Annotated[
            float | None,
            typer.Option(
                "--top-p",
                help="Sample from the smallest set of likeliest tokens holding this probability (default: the "
                "model's generation config, else 1.0 = off). Turns sampling on.",
            ),
        ],
        None,
    ),
    _parameter(
        "top_k",
        Annotated[
            int | None,
            typer.Option(
                "--top-k",
                help="Sample from the K likeliest tokens (0 = off; default: the model's generation config, "
                "else 50 as in transformers). Turns sampling on.",
            ),
        ],
        None,
    ),
    _parameter(
        "repetition_penalty",
        Annotated[
            float | None,
            typer.Option(
                "--repetition-penalty",
                help="Penalize tokens already in the conversation (>1; default: the model's generation "
                "config, else 1.0). Turns sampling on.",
            ),
        ],
        None,
    ),
    _parameter(
        "seed",
        Annotated[
            int | None,
            typer.Option(
                "--seed",
                help="Seed of the sampler: the same seed on the same device gives the same tokens "
                "(default: random; tr bench: 0).",
            ),
        ],
        None,
    ),
    _parameter(
        "matrix",
        Annotated[
            Path | None, typer.Option("--matrix", help="Use this matrix file instead of the model's stored one.")
        ],
        None,
    ),
    _parameter(
        "cold",
        Annotated[bool, typer.Option("--cold", help="Start from an empty matrix (the stored one is not read).")],
        False,
    ),
    _parameter(
        "no_save", Annotated[bool, typer.Option("--no-save", help="Do not write the matrix back at exit.")], False
    ),
    _parameter("device", Device, "auto"),
    _parameter("dtype", Dtype, "auto"),
    _parameter(
        "weights",
        Annotated[
            str,
            typer.Option(
                "--weights",
                help=f"{', '.join(WEIGHTS_NAMES)}. auto: follow the model file (a GGUF of 4 bits or fewer runs "
                "int4, of 5-8 bits int8, on the CPU; anything else dense); dense: the model's weights in --dtype; "
                "int8 / int4: weight-only "
                "quantized matmuls on the CPU (bfloat16 activations; --compare runs generate on the same quantized "
                "model); int8+bf16 / int4+bf16 also keep the bfloat16 weights for prompts (about 2x faster prompt "
                "processing, more memory). bfloat16 runs torch's kernels, meant for CPUs where tr's cannot run: "
                "their step cost grows with every drafted token (SmolLM2: 71 ms one token, 508 ms an 80-node "
                "tree, ~6 ms on tr's kernels), so trees stay small.",
            ),
        ],
        AUTO,
    ),
)

Command = TypeVar("Command", bound=Callable[..., None])


def decoding_options(model_as_option: bool = False) -> Callable[[Command], Command]:
    """Add the shared decoding parameters to a Typer command whose own parameters end with
    `*, options: DecodingOptions` (the shared ones follow the command's own in --help too).
    The model is the positional MODEL argument or -m/--model, or with `model_as_option` only
    -m/--model (for a command whose argument is something else)."""
    if model_as_option:
        before, after = [], [_parameter("model", ModelOption, None)]
    else:  # positional, before the command's own parameters; -m/--model after them
        argument = inspect.Parameter(
            "model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ModelArgument, default=None
        )
        before, after = [argument], [_parameter("model_flag", ModelFlag, None)]
    names = ["model", *(p.name for p in DECODING_PARAMETERS)]

    def wrap(command: Command) -> Command:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "options"]
        parameters = [*before, *own, *after, *DECODING_PARAMETERS]

        @functools.wraps(command)
        def run(**values: object) -> None:  # Typer passes every parameter by name
            if not model_as_option:
                values["model"] = one_model(values["model"], values.pop("model_flag"))
            settings = {name: values.pop(name) for name in names}
            settings["save"] = not settings.pop("no_save")
            return command(options=DecodingOptions.parse(**settings), **values)

        run.__signature__ = inspect.Signature(parameters)  # what Typer reads
        return run  # type: ignore[return-value]

    return wrap
