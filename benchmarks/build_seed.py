"""Build the starter state shipped for the packaged model (tr_cli/seed/): a matrix, its acceptance
statistics and a recycled store, learned by decoding benchmarks/prompts/seed.jsonl.

Those 80 prompts were written for this project (everyday questions, writing, code, how-tos, math,
summaries and rewrites of passages written for it) and share no text with Spec-Bench, MBPP, the
bundled sample or benchmarks/prompts/own.jsonl; the replies are the packaged SmolLM2-135M-Instruct's
own greedy output (Apache-2.0). A new user's first run starts from this state instead of an empty
matrix; numbers measured from it are "warmed on disjoint prompts".

Usage: python benchmarks/build_seed.py [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tr_cli.core import StopCondition
from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.store.acceptance_file import acceptance_path
from tr_cli.store.matrix_file import default_path, tokenizer_fingerprint
from tr_cli.store.paths import seed_dir
from tr_cli.store.recycled_file import recycled_store_path
from tr_cli.text.conversation import ConversationEncoder, messages_of
from tr_cli.text.prompts import load_prompts

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "seed.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        probe = Engine.open(DecodingOptions(), matrix=False, decoder=False)
        loaded = probe.loaded
        name = default_path(tokenizer_fingerprint(loaded.tokenizer), loaded.vocab_size, 8).name
        target = Path(scratch) / name
        # A fresh matrix at a scratch path: nothing of the user's store goes into the seed.
        engine = Engine.open(DecodingOptions(matrix=target))
        assert engine.hot.state == "new", engine.hot.describe()
        decoder, encoder = engine.decoder, ConversationEncoder(loaded.tokenizer)
        stop = StopCondition.build(args.max_new_tokens, loaded.eos_token_ids)
        records = load_prompts(args.prompts)
        for number, record in enumerate(records, start=1):
            history: list[tuple[str, str]] = []
            for text in record.turns:
                decoder.reset()  # as tr bench runs turns; the previous conversation joins the store
                ids = encoder.encode(messages_of(history, text, None)).ids
                reply = decoder.generate(ids, stop)
                history.append((text, loaded.tokenizer.decode(reply.tokens, skip_special_tokens=True)))
                print(
                    f"{number}/{len(records)} {record.id}: {len(reply.tokens)} tokens, "
                    f"MAT {reply.stats.mean_accepted_tokens:.2f}",
                    flush=True,
                )
        saved = engine.save()
        print(f"saved {saved}")
        out = seed_dir()
        for path in (target, recycled_store_path(target), acceptance_path(target)):
            shutil.copyfile(path, out / path.name)
            print(f"{out / path.name}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
