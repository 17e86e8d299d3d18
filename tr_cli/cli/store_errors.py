"""Store errors in the command line's words: the remedies a FixableError carries
(tr_cli/store/remedies.py) named as the flags and commands that apply them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..store.remedies import FixableError, Remedy

# Remedies a flag or command applies; the others read the same here as anywhere.
FLAG_WORDS: dict[Remedy, str] = {
    Remedy.OTHER_MATRIX: "pass another --matrix",
    Remedy.COLD: "use --cold",
    Remedy.NO_SAVE: "add --no-save",
    Remedy.REBUILD: "rebuild it with tr matrix init --force",
    Remedy.OVERWRITE: "pass --force to overwrite it",
    Remedy.REPLACE: "use --replace to overwrite it",
    Remedy.ANY_TOKENIZER: "pass --force to import anyway",
    Remedy.MATRIX_K: "pass its k as --k",
    Remedy.MATRIX_MODEL: "pass the model it was built for as --model",
}


def in_flag_words(exc: FixableError) -> FixableError:
    """The same error, its remedies named as flags."""
    return exc.worded(FLAG_WORDS)


@contextlib.contextmanager
def flag_words() -> Iterator[None]:
    """FixableErrors raised inside leave it with their remedies named as flags."""
    try:
        yield
    except FixableError as exc:
        raise in_flag_words(exc) from None
