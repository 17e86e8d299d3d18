"""Text a user hands in (an argument, standard input, a request body), checked to be Unicode
before it reaches a tokenizer: bytes that are not UTF-8 arrive in Python as lone surrogates
(argv and stdin decode with surrogateescape; JSON can spell them as \\ud800 escapes), and a
tokenizer meets them with an error that names none of this."""

from __future__ import annotations

from typing import TextIO

from ..errors import UserError, first_line

# surrogateescape maps an undecodable byte b (0x80-0xff) to U+DC00 + b.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def unicode_problem(text: str) -> str | None:
    """What keeps `text` from being Unicode, in a few words; None when it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if code in _ESCAPED_BYTES:
            return f"byte 0x{code - 0xDC00:02x} at character {exc.start + 1} is not valid UTF-8"
        return f"an unpaired surrogate (\\u{code:04x}) at character {exc.start + 1}"
    return None


def checked_input(text: str, what: str) -> str:
    """`text`, or a UserError naming `what` (e.g. "--prompt") when it is not Unicode."""
    problem = unicode_problem(text)
    if problem:
        raise UserError(f"{what}: {problem}; give UTF-8 text")
    return text


def read_input(stream: TextIO | None, what: str) -> str:
    """All of `stream` (standard input) as checked text; a closed one is a UserError."""
    if stream is None or stream.closed:
        raise UserError(f"{what}: standard input is closed; pipe the text in")
    try:
        data = stream.read()
    except (OSError, ValueError) as exc:
        raise UserError(f"{what}: cannot read standard input ({first_line(exc)})") from None
    return checked_input(data, what)
