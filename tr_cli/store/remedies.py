"""What a user can do about stored state tr cannot use, named without a command line.

The store layer does not know how it was called, so its errors name no flags: a FixableError
carries what is wrong (`problem`, one line naming the file) and what would fix it (`remedies`,
members of Remedy). Its message words the remedies plainly; the command line words them as the
flags that apply them (tr_cli/cli/store_errors.py), as it words a SettingError's setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum

from ..errors import MatrixFileError, StoreError, StoreFileError


class Remedy(Enum):
    """One way out; the value is its plain wording."""

    MOVE_AWAY = "move it away"
    OTHER_MATRIX = "use another matrix file"
    OWN_MATRIX = "use the model's own matrix"
    COLD = "start from an empty matrix"
    NO_SAVE = "save nothing at exit"
    REINSTALL = "reinstall tr"
    REBUILD = "rebuild it from text"
    OVERWRITE = "overwrite it"
    REPLACE = "replace it rather than merge into it"
    ANY_TOKENIZER = "import it anyway, as this tokenizer's"
    MATRIX_K = "import it for the k it was built with"
    MATRIX_MODEL = "name the model it was built for"
    EXPORT_ALONE = "move it away to export the matrix alone"


PLAIN: Mapping[Remedy, str] = {remedy: remedy.value for remedy in Remedy}


def either(options: Iterable[str]) -> str:
    """'a', 'a or b', 'a, b, or c'."""
    items = list(options)
    if len(items) <= 2:
        return " or ".join(items)
    return f"{', '.join(items[:-1])}, or {items[-1]}"


class FixableError(StoreError):
    """Stored state tr cannot use as it is, with the remedies that would fix it."""

    def __init__(
        self, problem: str, remedies: Iterable[Remedy] = (), words: Mapping[Remedy, str] | None = None
    ) -> None:
        self.problem = problem
        self.remedies = tuple(remedies)
        super().__init__(self._message(words or PLAIN))

    def _message(self, words: Mapping[Remedy, str]) -> str:
        if not self.remedies:
            return self.problem
        return f"{self.problem}; {either(words.get(remedy, remedy.value) for remedy in self.remedies)}"

    def worded(self, words: Mapping[Remedy, str]) -> FixableError:
        """The same error (same class), its remedies worded with `words` (those it lacks: plainly)."""
        return type(self)(self.problem, self.remedies, words)


class FixableMatrixFileError(FixableError, MatrixFileError):
    """A file that is not a usable matrix, with what would fix it."""


class FixableRecycledStoreError(FixableError, StoreFileError):
    """A file that is not a usable recycled store, with what would fix it."""
