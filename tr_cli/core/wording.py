"""How a count reads in a message: "1 text", "2 texts", "1,024 nodes" (one rule for every layer)."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` with thousands separators and `noun` in the number it takes (`plural`: when adding
    an s is wrong)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
