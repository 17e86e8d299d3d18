"""Store errors carry their remedies, worded plainly until a caller words them its way."""

import pytest

from tr_cli.errors import MatrixFileError, StoreError, StoreFileError
from tr_cli.store.remedies import (
    FixableError,
    FixableMatrixFileError,
    FixableRecycledStoreError,
    Remedy,
    either,
)


def test_either_lists_the_options():
    assert either([]) == "" and either(["a"]) == "a" and either(["a", "b"]) == "a or b"
    assert either(["a", "b", "c"]) == "a, b, or c"


def test_the_plain_message_is_the_problem_then_the_remedies():
    exc = FixableError("m.safetensors: broken", (Remedy.MOVE_AWAY, Remedy.REINSTALL))
    assert str(exc) == "m.safetensors: broken; move it away or reinstall tr"
    assert exc.problem == "m.safetensors: broken" and exc.remedies == (Remedy.MOVE_AWAY, Remedy.REINSTALL)
    assert str(FixableError("m.safetensors: broken")) == "m.safetensors: broken"


@pytest.mark.parametrize(
    "kind, family",
    [
        (FixableError, StoreError),
        (FixableMatrixFileError, MatrixFileError),
        (FixableRecycledStoreError, StoreFileError),
    ],
)
def test_worded_keeps_the_class_and_words_only_what_it_is_given(kind, family):
    exc = kind("x: broken", (Remedy.COLD, Remedy.REINSTALL))
    worded = exc.worded({Remedy.COLD: "use --cold"})
    assert type(worded) is kind and isinstance(worded, family) and isinstance(worded, FixableError)
    assert str(worded) == "x: broken; use --cold or reinstall tr"
    assert worded.problem == exc.problem and worded.remedies == exc.remedies
    assert str(exc) == "x: broken; start from an empty matrix or reinstall tr"  # the original is unchanged
