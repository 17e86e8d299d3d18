"""Messages typed over several prompt lines between triple quotes."""

from __future__ import annotations

BLOCK_QUOTE = '"""'


class MultilineInput:
    '''Gathers `"""`-quoted messages over several prompt lines.

    `"""` starts a block (text may follow on the same line); the block ends at the first line
    that ends with `"""`. `"""one line"""` is a block too. Block text is always a message, never
    a command.
    '''

    def __init__(self) -> None:
        self._lines: list[str] | None = None

    @property
    def active(self) -> bool:
        return self._lines is not None

    def cancel(self) -> None:
        self._lines = None

    def feed(self, line: str) -> tuple[str, bool] | None:
        """A prompt line in; (message, was_a_block) once complete, else None (need more lines)."""
        if self._lines is None:
            if not line.lstrip().startswith(BLOCK_QUOTE):
                return line, False
            rest = line.lstrip()[len(BLOCK_QUOTE) :]
            if rest.rstrip().endswith(BLOCK_QUOTE):
                return rest.rstrip()[: -len(BLOCK_QUOTE)], True
            self._lines = [rest] if rest.strip() else []
            return None
        if line.rstrip().endswith(BLOCK_QUOTE):
            last = line.rstrip()[: -len(BLOCK_QUOTE)]
            if last.strip():
                self._lines.append(last)
            text = "\n".join(self._lines)
            self._lines = None
            return text, True
        self._lines.append(line)
        return None
