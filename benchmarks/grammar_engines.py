"""Grammar engines for structured output, side by side on CPU: llguidance (tr's) and xgrammar.

For each schema of a set (the JSON-extraction prompts' 20 and a few with harder keywords): whether
each engine takes it (and whether it says so when it cannot enforce a keyword), then, on JSON
instances written for the extraction schemas, the cost per token of a full token mask, of
consuming a token and of the forced-token (llguidance) / jump-forward (xgrammar) query. xgrammar
is optional (`pip install xgrammar`; it pulls in triton and tvm-ffi): without it only llguidance
runs. Timings are medians over every token of every instance; run it on an idle machine.

    python benchmarks/grammar_engines.py
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time
from functools import partial
from pathlib import Path

from tr_cli.core.matrix import output_vocab_size  # noqa: F401 - torch first, as tr loads it
from tr_cli.models.load import load_tokenizer
from tr_cli.text.grammar import JSON_LAYOUT

PROMPTS = Path(__file__).parent / "prompts" / "json_extraction.jsonl"
HARD = {
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "if/then": {
        "type": "object",
        "properties": {"c": {"type": "string"}},
        "if": {"properties": {"c": {"const": "US"}}},
        "then": {"required": ["zip"]},
    },
    "not": {"not": {"type": "string"}},
    "recursive $ref": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/n",
    },
    "pattern": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
    "format uuid": {"type": "string", "format": "uuid"},
}


def instance(schema: dict) -> object:
    """A small JSON instance of an extraction schema (their keywords are simple)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {key: instance(sub) for key, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [instance(schema["items"])] * max(schema.get("minItems", 1), 1)
    if kind == "integer":
        return int(schema.get("minimum", 3))
    if kind == "number":
        return float(schema.get("minimum", 2.5))
    if kind == "boolean":
        return True
    if schema.get("format") == "date":
        return "2024-05-06"
    if schema.get("format") == "email":
        return "ada@example.com"
    return "Ada Lovelace"[: schema.get("maxLength", 12)]


def median_us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f} us" if values else "-"


def main() -> None:
    import llguidance
    import llguidance.hf

    tokenizer, vocab, _ = load_tokenizer(None, cache=Path.home() / ".cache" / "tr")
    records = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    schemas = {record["question_id"]: record["schema"] for record in records} | HARD
    engines = {"llguidance": llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=[tokenizer.eos_token_id])}
    try:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        engines["xgrammar"] = xgrammar.GrammarCompiler(info)
    except ImportError:
        print("xgrammar is not installed: llguidance only")

    print("| schema | " + " | ".join(engines) + " |\n|---|" + "---|" * len(engines))
    for name, schema in schemas.items():
        cells = []
        for engine, handle in engines.items():
            if engine == "llguidance":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    schema, overrides={**JSON_LAYOUT, "lenient": False}
                )
                failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, handle)
                cells.append(f"refused: {messages[0].splitlines()[0][:60]}" if failed else "ok")
            else:
                try:
                    handle.compile_json_schema(json.dumps(schema), any_whitespace=False)
                    cells.append("ok")
                except Exception as exc:  # noqa: BLE001 - any refusal is a result here
                    cells.append(f"refused: {str(exc)[:60]}")
        print(f"| {name} | " + " | ".join(cells) + " |")

    print("\nper token, over instances of the 20 extraction schemas:")
    for engine, handle in engines.items():
        timings: dict[str, list[float]] = {"mask": [], "forced/jump-forward": [], "consume": []}
        for record in records:
            text = json.dumps(instance(record["schema"]), separators=(", ", ": "))
            ids = tokenizer.encode(text, add_special_tokens=False)
            if engine == "llguidance":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(record["schema"], overrides={**JSON_LAYOUT})
                matcher = llguidance.LLMatcher(handle, grammar, log_level=0)
                bits = bytearray(((vocab + 31) // 32) * 4)
                pointer = ctypes.addressof(ctypes.c_char.from_buffer(bits))
                steps = (partial(matcher.unsafe_compute_mask_ptr, pointer, len(bits)), matcher.compute_ff_tokens)
                time_tokens(ids, *steps, matcher.consume_token, timings)
            else:
                compiled = handle.compile_json_schema(json.dumps(record["schema"]), any_whitespace=False)
                matcher = xgrammar.GrammarMatcher(compiled)
                bitmask = xgrammar.allocate_token_bitmask(1, vocab)
                steps = (partial(matcher.fill_next_token_bitmask, bitmask), matcher.find_jump_forward_string)
                time_tokens(ids, *steps, matcher.accept_token, timings)
        costs = ", ".join(f"{name} {median_us(values)}" for name, values in timings.items())
        print(f"{engine}: {costs} ({len(timings['mask'])} tokens)")


def time_tokens(ids: list[int], mask, ahead, consume, timings: dict[str, list[float]]) -> None:
    """Per token of `ids`: the time of a full mask, of the forced-token query and of consuming it."""
    for token in ids:
        t0 = time.perf_counter()
        mask()
        t1 = time.perf_counter()
        ahead()
        t2 = time.perf_counter()
        ok = consume(token)
        t3 = time.perf_counter()
        if not ok:
            return
        timings["mask"].append(t1 - t0)
        timings["forced/jump-forward"].append(t2 - t1)
        timings["consume"].append(t3 - t2)


if __name__ == "__main__":
    main()
