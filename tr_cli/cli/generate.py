"""`tr generate`: one prompt, streamed Token Recycling output, then its stats."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ..core.stopping import NoRoomForReply, StopCondition, reply_budget
from ..engine.options import DecodingOptions
from ..errors import UserError
from ..store.paths import cache_dir
from ..text.conversation import encode_prompt
from ..text.input_text import checked_input, read_input
from ..text.prompts import sample_prompts
from ..text.streaming import IncrementalDecoder
from .console import note, stderr, warn, write_out
from .options import decoding_options

if TYPE_CHECKING:  # torch and transformers load when the command runs, not for its --help
    from collections.abc import Callable

    from ..core.events import GenerationStats
    from ..core.sampling_config import SamplingConfig
    from ..models import LoadedModel
    from ..text.grammar import Grammar, GrammarConstraint

Prompt = Annotated[
    str | None, typer.Option("--prompt", "-p", help="Prompt text ('-' reads stdin). Default: a bundled sample prompt.")
]
StopStrings = Annotated[list[str], typer.Option("--stop", help="Stop once the output contains this text (repeatable).")]
Compare = Annotated[
    bool,
    typer.Option(
        "--compare",
        help="Also run transformers' generate with the same settings: speedup, and (greedy) the "
        "identical-output check.",
    ),
]
Schema = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="The reply is JSON matching this JSON Schema: a file, or the schema's JSON text. Decoding "
        "follows the schema's grammar, and what it forces is drafted for free.",
        show_default=False,
    ),
]
JsonObject = Annotated[bool, typer.Option("--json", help="The reply is one JSON object (any keys).")]


@decoding_options()
def generate(
    prompt: Prompt = None,
    stop_strings: StopStrings = [],  # noqa: B006 - Typer's way of declaring a repeatable option
    compare: Compare = False,
    schema: Schema = None,
    json_object: JsonObject = False,
    *,
    options: DecodingOptions,
) -> None:
    """Generate a reply to one prompt with Token Recycling and print its stats."""
    grammar = None
    if schema is not None or json_object:  # llguidance and torch load only for a grammar
        from ..text.schema_option import reply_grammar

        grammar = reply_grammar(schema, json_object)
    if prompt == "-":
        prompt = read_input(sys.stdin, "--prompt -")
    elif prompt is None:
        prompt = sample_prompts()[0].turns[0]
    else:
        prompt = checked_input(prompt, "--prompt")
    if not prompt.strip():
        raise UserError("--prompt is empty; give some text")

    from ..core.events import GenerationResult, GenerationStats, track
    from .setup import open_engine, save_state

    _refuse_past_context(prompt, options)
    engine = open_engine(options)
    loaded, decoder = engine.loaded, engine.decoder
    constraint_of = _constraints(loaded, grammar) if grammar is not None else None
    constraint = constraint_of() if constraint_of is not None else None
    decoder.set_constraint(constraint)  # before the budget: the grammar's drafts reach deeper
    input_ids = encode_prompt(loaded.tokenizer, prompt)
    max_new_tokens = _fit_context(options.max_new_tokens, len(input_ids), loaded.context_length, decoder.max_depth)
    stop = StopCondition.build(
        max_new_tokens,
        loaded.eos_token_ids,
        stop_strings,
        decode=lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True),
    )
    label = Text("Prompt:", style="bold")
    label.append(f" {prompt.strip()}")
    stderr.print(label, soft_wrap=True)
    text = IncrementalDecoder(loaded.tokenizer)
    result = GenerationResult(stats=GenerationStats(prompt_tokens=len(input_ids)))
    try:
        for event in track(decoder.steps(input_ids, stop), result):
            write_out(text.push(event.new_tokens))
    finally:
        try:
            write_out(text.finish() + "\n")  # a reply ending mid-character keeps those bytes
        finally:
            save_state(engine)  # also on Ctrl-C or a closed stdout: what was learned so far is kept
    note(stats_summary(result.stats))
    if constraint is not None and not constraint.complete:
        warn(_incomplete_json(result.stats.finish_reason, max_new_tokens < options.max_new_tokens))
    if compare:
        _compare(
            loaded,
            input_ids,
            max_new_tokens,
            stop_strings,
            result.tokens,
            result.stats.tokens_per_second,
            engine.sampling,
            constraint_of,
        )


def _constraints(loaded: LoadedModel, grammar: Grammar) -> Callable[[], GrammarConstraint]:
    """Fresh constraints in the grammar's initial state (tr's reply, then --compare's); the reply's
    is built before any decoding, so a grammar refused for this tokenizer stops there."""
    from ..text.schema_option import grammar_constraints

    constraint_of = grammar_constraints(
        loaded.tokenizer, loaded.model, loaded.eos_token_ids, "--schema/--json cannot be used with this model"
    )
    return lambda: constraint_of(grammar)


def _incomplete_json(finish_reason: str | None, clamped: bool) -> str:
    """The warning for a reply whose JSON stopped before its end, with the cause a user can act on."""
    said = f"the reply stopped ({finish_reason}) before its JSON was complete"
    if finish_reason == "length" and not clamped:
        return f"{said}; raise --max-new-tokens"
    if finish_reason == "length":
        return f"{said}: the model's context is full; shorten the prompt"
    if finish_reason == "stop_string":
        return f"{said}: a --stop string came first"
    return said


def _refuse_past_context(prompt: str, options: DecodingOptions) -> None:
    """Refuse a prompt that leaves no room for even one reply token with the tokenizer and config
    alone (a second), not after loading the weights and measuring t(N) (minutes on a fresh home).
    The drafts' positions are the decoder's, known once it is built: _fit_context counts them."""
    from ..models.load import load_prompt_side
    from .setup import progress

    with progress() as status:
        tokenizer, context = load_prompt_side(options.model, cache=cache_dir(), status=status)
    prompt_tokens = len(encode_prompt(tokenizer, prompt))
    try:
        reply_budget(1, context, 0, prompt_tokens, 0)
    except NoRoomForReply:
        raise UserError(
            f"the prompt has {prompt_tokens:,} tokens; the model's context holds {context:,}: shorten the prompt"
        ) from None


def _fit_context(wanted: int, prompt_tokens: int, context: int | None, max_depth: int) -> int:
    """Refuse a prompt the model's context cannot hold before any forward (a 25k-token prompt on an
    8k model used to run for minutes and print garbage); clamp the budget to what is left."""
    try:
        budget = reply_budget(wanted, context, 0, prompt_tokens, max_depth)
    except NoRoomForReply:
        raise UserError(
            f"the prompt has {prompt_tokens:,} tokens; the model's context holds {context:,} "
            f"({max_depth} more are needed for drafts): shorten the prompt"
        ) from None
    if budget < wanted:
        note(f"--max-new-tokens {wanted} clamped to {budget}: what the model's context of {context:,} tokens leaves")
    return budget


def stats_summary(stats: GenerationStats) -> str:
    """The line after a generation: tokens, rate, MAT, and where each step's time went."""
    from .live_view import step_split

    outside = stats.outside_forward
    return (
        f"{stats.new_tokens} tokens in {stats.wall_seconds:.2f}s · {stats.tokens_per_second:.1f} tok/s · "
        f"MAT {stats.mean_accepted_tokens:.2f} over {stats.steps} steps · "
        f"prefill {stats.prefill_seconds * 1e3:.0f} ms · {step_split(stats)} "
        f"({'–' if outside is None else f'{outside:.1%}'} outside the forward) · finish: {stats.finish_reason}"
    )


def _compare(
    loaded: LoadedModel,
    input_ids: list[int],
    max_new_tokens: int,
    stop_strings: list[str],
    tokens: list[int],
    tr_tps: float,
    sampling: SamplingConfig,
    constraint_of: Callable[[], GrammarConstraint] | None,
) -> None:
    import torch

    from ..core.events import tokens_per_second

    ids = torch.tensor([input_ids], device=loaded.runtime.device)
    pad = loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
    if not sampling.is_greedy:
        torch.manual_seed(sampling.seed if sampling.seed is not None else 0)
    with torch.inference_mode():
        start = time.perf_counter()
        extra = {"stop_strings": stop_strings, "tokenizer": loaded.tokenizer} if stop_strings else {}
        if constraint_of is not None:  # the same grammar, as a logits processor
            from ..text.grammar_logits import GrammarLogitsProcessor

            extra["logits_processor"] = [GrammarLogitsProcessor(constraint_of(), len(input_ids))]
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **sampling.generate_kwargs(),
            **extra,
        )
        seconds = time.perf_counter() - start
    baseline = out[0, len(input_ids) :].tolist()
    base_tps = tokens_per_second(len(baseline), seconds)
    if sampling.is_greedy:
        same = greedy_comparison(baseline, tokens, loaded.runtime.dtype_name)
    else:  # two independent samples of the same distribution: nothing to compare token by token
        same = "sampled: outputs differ by chance (tr bench checks the distribution)"
    label = "greedy" if sampling.is_greedy else "sampling"
    stderr.print(
        f"[bold]transformers {label}:[/] {len(baseline)} tokens, {base_tps:.1f} tok/s · "
        f"[bold]Token Recycling speedup {tr_tps / base_tps if base_tps else 0:.2f}×[/] · {same}"
    )


def greedy_comparison(baseline: list[int], tokens: list[int], dtype_name: str) -> str:
    """What --compare says of a greedy reply against `generate`'s. Outside float32 a many-token
    forward rounds differently from generate's one token at a time, so replies may part at
    near-ties (docs/weights.md): said, so that a user does not take it for a lost guarantee."""
    if baseline == tokens:
        return "output identical"
    said = f"output differs from token {_first_difference(baseline, tokens)}"
    if dtype_name == "float32":
        return said
    why = f"{dtype_name} rounds a step of many tokens unlike generate's one token at a time"
    return f"{said} ({why}: replies part at near-ties; --dtype float32 is the exactness check)"


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # outputs may differ in length
        if x != y:
            return i
    return min(len(a), len(b))
