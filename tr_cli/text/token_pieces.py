"""One token on its own: its text and its exact bytes (what log-probabilities name a token by).

Decoding a token alone gives its text, but a token may hold part of a character (byte-level BPE
splits a multi-byte character over tokens; SentencePiece has byte-fallback tokens `<0xE6>`), which
decodes to U+FFFD. Its bytes come from the vocabulary itself: a byte-level vocabulary spells each
byte with one printable character (GPT-2's mapping), a byte-fallback piece names its byte, and
SentencePiece's `▁` is a space.
"""

from __future__ import annotations

import json
import re
from functools import cached_property, lru_cache

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level spelling, inverted: printable bytes stand for themselves, the other 68
    bytes for the characters 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + extra)
            extra += 1
    return {char: byte for byte, char in chars.items()}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return '"ByteLevel"' in json.dumps(decoder)


class TokenPieces:
    """A tokenizer's tokens one at a time (each answer kept: a vocabulary's worth at most)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self._text: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}

    @cached_property
    def byte_level(self) -> bool:
        """Read on first use (it serializes the whole tokenizer): a server never asked for
        log-probabilities never pays it."""
        return _is_byte_level(self.tokenizer)

    def text(self, token: int) -> str:
        if token not in self._text:
            self._text[token] = self.tokenizer.decode([token])
        return self._text[token]

    def bytes(self, token: int) -> bytes:
        if token not in self._bytes:
            self._bytes[token] = self._raw(token)
        return self._bytes[token]

    def _raw(self, token: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if not isinstance(piece, str) or token in self.special:
            return self.text(token).encode("utf-8")
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        if self.byte_level:
            alphabet = _byte_level_alphabet()
            if all(char in alphabet for char in piece):
                return bytes(alphabet[char] for char in piece)
        return piece.replace("▁", " ").encode("utf-8")
