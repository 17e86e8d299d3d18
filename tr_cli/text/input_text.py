"""Text a user hands in (an argument, standard input, a request body), checked to be Unicode
before it reaches a tokenizer: bytes that are not UTF-8 arrive in Python as lone surrogates
(argv and stdin decode with surrogateescape; JSON can spell them as \\ud800 escapes), and a
tokenizer meets them with an error that names none of this."""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO

from ..errors import UserError, first_line

# How much tr reads from one input: one place for every limit, so that an endless source
# (/dev/zero, /dev/urandom, a pipe that never ends) is refused after a bounded read instead of
# filling memory. Reads go in chunks, so that Ctrl-C and SIGTERM act between them (one
# unbounded read() is a single C call that checks no signal until it returns).
MAX_MESSAGE_BYTES = 8 << 20  # a prompt or message: -p -, tr chat's stdin (the server's body limit)
MAX_FILE_BYTES = 64 << 20  # a file read whole: prompt sets, corpora, schemas, reports, transcripts
_CHUNK_BYTES = 1 << 20


class InputTooLong(UserError):
    """An input past its limit (`source`: what was read, as the message names it)."""


class UnreadableText(UserError):
    """A text file that cannot be read (`source`: the path as said; `reason`: what is wrong)."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


def size_words(limit: int) -> str:
    """A byte limit as people say it: 8 MB, 64 MB."""
    return f"{limit / (1 << 20):g} MB"


def read_bounded(handle: BinaryIO, limit: int) -> bytes | None:
    """At most `limit` bytes of `handle`, read in chunks; None when it holds more."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = handle.read(min(_CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None


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


def read_input(stream: TextIO | None, what: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """All of `stream` (standard input) as checked text, at most `limit` bytes of it; a closed
    stream or a longer input is a UserError."""
    if stream is None or stream.closed:
        raise UserError(f"{what}: standard input is closed; pipe the text in")
    try:
        raw = getattr(stream, "buffer", None)
        if raw is not None:  # bytes, decoded as the stream would (argv's surrogateescape included)
            data = read_bounded(raw, limit)
            text = None if data is None else data.decode(stream.encoding or "utf-8", stream.errors or "strict")
        else:  # a text stream without bytes under it (a test's StringIO): characters stand for bytes
            text = _read_text_bounded(stream, limit)
    except (OSError, ValueError) as exc:
        raise UserError(f"{what}: cannot read standard input ({first_line(exc)})") from None
    if text is None:
        raise InputTooLong(
            f"{what}: standard input holds more than {size_words(limit)}, the most tr reads as one "
            "message; pipe in less (is it endless, like /dev/zero?)"
        )
    return checked_input(text, what)


def _read_text_bounded(stream: TextIO, limit: int) -> str | None:
    parts: list[str] = []
    size = 0
    while True:
        part = stream.read(min(_CHUNK_BYTES, limit + 1 - size))
        if not part:
            return "".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            return None


def read_text_file(path: str | Path, what: str = "", limit: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file's content, at most `limit` bytes; a FIFO or device is read as it comes
    (`tr bench <(...)`, /dev/stdin). UnreadableText, naming `what` and the path, when it is
    missing, a folder, not UTF-8, unreadable or longer than `limit` (an endless device included:
    the read stops at the limit, and at the first byte that is not UTF-8)."""
    source = f"{what}{path}"
    path = Path(path)
    try:
        kind = path.stat().st_mode
    except FileNotFoundError:
        raise UnreadableText(source, "no such file") from None
    except (OSError, ValueError) as exc:
        raise UnreadableText(source, f"cannot use this path ({first_line(exc)})") from None
    if stat.S_ISDIR(kind):
        raise UnreadableText(source, "is a folder, not a file")
    regular = stat.S_ISREG(kind)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    parts: list[str] = []
    size = 0
    try:
        with open(path, "rb") as handle:
            if regular and (total := os.fstat(handle.fileno()).st_size) > limit:
                raise UnreadableText(
                    source, f"{total / (1 << 20):.0f} MB, more than the {size_words(limit)} tr reads from one file"
                )
            while True:
                chunk = handle.read(min(_CHUNK_BYTES, limit + 1 - size))
                start = size - len(decoder.getstate()[0])  # where the bytes decoded next begin
                if not chunk:
                    parts.append(decoder.decode(b"", final=True))
                    break
                size += len(chunk)
                if size > limit:
                    endless = "" if regular else " (is it endless, like /dev/zero?)"
                    raise UnreadableText(source, f"more than the {size_words(limit)} tr reads from one file{endless}")
                parts.append(decoder.decode(chunk))
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise UnreadableText(
            source, f"cannot read it as UTF-8 text (byte 0x{byte:02x} at byte {start + exc.start + 1:,} is not UTF-8)"
        ) from None
    except OSError as exc:
        raise UnreadableText(source, f"cannot read it ({exc.strerror or first_line(exc)})") from None
    return "".join(parts)
