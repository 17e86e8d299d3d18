"""tr's errors, in one small hierarchy. The command line turns each into one line on stderr and
exit status 1 (tr_cli/cli/errors.py); nothing else prints them.

    TrError                    core/errors.py: the root
    ├── UnsupportedAttention   a model whose attention the decoder cannot mask (core)
    ├── InvalidTree            a draft tree spec that is not valid (core)
    ├── SettingError           a setting's value that cannot be used; names the setting, not the flag
    ├── UserError              an option, argument or input file that cannot be used as given
    ├── ModelError             a model argument that cannot be resolved or loaded
    ├── OutputError            standard output that cannot take the text (cli/console.py)
    └── StoreError             stored state (a matrix or recycled store file) that cannot be used
        ├── MatrixFileError    a file that is not a usable matrix
        ├── StoreFileError     a file that is not a usable recycled store
        └── FixableError       store/remedies.py: one whose ways out are Remedy values, which each
                               surface words (cli/store_errors.py: as flags)

Messages say what is wrong and what to do, in one line.
"""

from __future__ import annotations

from .core.errors import InvalidTree, SettingError, TrError, UnsupportedAttention


def first_line(exc: BaseException) -> str:
    """An exception as a short reason inside a one-line message (its type when it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class UserError(TrError):
    """A problem with what the user asked for; the message says what to do."""


class ModelError(TrError):
    """A model argument tr cannot use: not found, not a model, not loadable."""


class StoreError(TrError):
    """Stored state tr cannot use as it is; the message names the file and what to do."""


class MatrixFileError(StoreError, ValueError):
    """A file that is not a usable tr matrix."""


class StoreFileError(StoreError, ValueError):
    """A file that is not a usable recycled store (the token streams of earlier conversations)."""


__all__ = [
    "InvalidTree",
    "MatrixFileError",
    "ModelError",
    "SettingError",
    "StoreError",
    "StoreFileError",
    "TrError",
    "UnsupportedAttention",
    "UserError",
]
