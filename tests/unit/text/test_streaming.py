"""IncrementalDecoder: streamed deltas add up to the full decode, never show a half character, and
stay right after the 64-token decode window slides. ReplyText: the same under stop strings, and a
reply cut inside a character keeps all of its bytes. Uses a fake byte-level tokenizer."""

from __future__ import annotations

import random

import pytest

from tr_cli.text.reply_text import ReplyText, first_stop, open_stop_tail
from tr_cli.text.streaming import IncrementalDecoder

SAMPLE = (
    "Token Recycling reuses candidates: café, naïve, Ærøskøbing; € and ¥ prices; 中文字符和日本語のテキスト; "
    "emoji 😀🚀👍🏽 and math ∑∫√. Ünïcödé everywhere — «quotes» and “curly” ones. "
)


class ByteTokenizer:
    """Each id stands for a byte string; decode joins the bytes of non-special ids and decodes UTF-8
    with errors='replace', so a character split across ids reads '\\ufffd' until it is complete."""

    SPECIAL = {0: b"<s>", 1: b"</s>"}

    def __init__(self, strip_leading_space: bool = False) -> None:
        self.pieces: list[bytes] = [self.SPECIAL[0], self.SPECIAL[1]]
        self.index: dict[bytes, int] = {}
        self.strip_leading_space = strip_leading_space  # SentencePiece-like: drop the first space
        self.calls = 0

    def encode(self, text: str, rng: random.Random, max_piece: int = 3) -> list[int]:
        """Split the UTF-8 bytes into pieces of 1..max_piece bytes, ignoring character boundaries."""
        data = text.encode("utf-8")
        ids, i = [], 0
        while i < len(data):
            n = rng.randint(1, max_piece)
            piece = data[i : i + n]
            if piece not in self.index:
                self.index[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.index[piece])
            i += n
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.calls += 1
        data = b"".join(self.pieces[i] for i in ids if not (skip_special_tokens and i in self.SPECIAL))
        text = data.decode("utf-8", errors="replace")
        if self.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text


def stream(decoder: IncrementalDecoder, ids: list[int], sizes) -> list[str]:
    deltas, i = [], 0
    for n in sizes:
        if i >= len(ids):
            break
        deltas.append(decoder.push(ids[i : i + n]))
        i += n
    assert i >= len(ids)
    return deltas


def check(tok: ByteTokenizer, ids: list[int], sizes) -> None:
    dec = IncrementalDecoder(tok)
    deltas = stream(dec, ids, sizes)
    full = tok.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in full  # the sample is valid UTF-8 once complete
    for d in deltas:
        assert "\ufffd" not in d
    assert "".join(deltas) == full
    assert dec.text() == full
    assert dec.tokens == ids


def test_fake_tokenizer_splits_characters():
    """Sanity check of the fake: multi-byte characters really are split across ids."""
    tok = ByteTokenizer()
    ids = tok.encode("é中😀" * 5, random.Random(0))
    partial = [tok.decode(ids[:k], skip_special_tokens=True) for k in range(1, len(ids))]
    assert any(p.endswith("\ufffd") for p in partial)
    assert tok.decode(ids, skip_special_tokens=True) == "é中😀" * 5


@pytest.mark.parametrize("seed", range(6))
def test_one_token_at_a_time(seed):
    """> 100 tokens pushed singly: the window slides several times; deltas add up exactly."""
    rng = random.Random(seed)
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE * 3, rng)
    assert len(ids) > 300
    check(tok, ids, [1] * len(ids))


@pytest.mark.parametrize("seed", range(6))
def test_random_chunks(seed):
    """Chunks of 1..20 tokens, as accepted paths of different lengths arrive."""
    rng = random.Random(100 + seed)
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE * 3, rng)
    check(tok, ids, [rng.randint(1, 20) for _ in range(len(ids))])


@pytest.mark.parametrize("chunk", [7, 63, 64, 65, 100, 1000])
def test_fixed_chunks_around_window(chunk):
    """Chunks just below, at and beyond the 64-token window, and all at once."""
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE * 2, random.Random(chunk))
    check(tok, ids, [chunk] * len(ids))


def test_pure_ascii_delta_per_token():
    """With one ASCII byte per id, every push returns exactly the new character."""
    tok = ByteTokenizer()
    text = "abcdefghij" * 20
    ids = tok.encode(text, random.Random(0), max_piece=1)
    dec = IncrementalDecoder(tok)
    for i, c in zip(ids, text, strict=True):
        assert dec.push([i]) == c


def test_incomplete_character_held_back():
    """A push ending mid-character holds that character back; the next push returns it whole."""
    tok = ByteTokenizer()
    euro = "€".encode()  # 3 bytes
    for piece in (b"a", euro[:1], euro[1:2], euro[2:]):
        tok.index[piece] = len(tok.pieces)
        tok.pieces.append(piece)
    a, e1, e2, e3 = (tok.index[p] for p in (b"a", euro[:1], euro[1:2], euro[2:]))
    dec = IncrementalDecoder(tok)
    assert dec.push([a]) == "a"
    assert dec.push([e1]) == ""
    assert dec.push([e2]) == ""
    assert dec.push([e3]) == "€"
    assert dec.push([a, e1]) == "a"  # complete characters never wait for an incomplete one
    assert dec.push([e2, e3, a]) == "€a"
    assert dec.push([e1, e2]) == ""
    assert dec.finish() == "\ufffd"  # generation ended mid-character: the bytes as decode reads them
    assert dec.finish() == ""


@pytest.mark.parametrize("seed", range(4))
def test_complete_characters_stream_although_the_end_is_always_incomplete(seed):
    """Emoji cut by every token (the issue-15 case): each push ends inside a character, yet all
    complete emoji before it come out at once, and finish() adds the rest: the deltas add up to
    the decoding of every token, cut at any length."""
    tok = ByteTokenizer()
    ids = tok.encode("🔥🚀🌊" * 4, random.Random(seed), max_piece=3)
    for end in range(1, len(ids) + 1):
        dec = IncrementalDecoder(tok)
        deltas = [dec.push([t]) for t in ids[:end]]
        full = tok.decode(ids[:end], skip_special_tokens=True)
        assert "".join(deltas) == full.rstrip("\ufffd")
        assert "".join(deltas) + dec.finish() == full


def test_special_tokens_skipped():
    """Special ids (skip_special_tokens=True) add no text, also when interleaved."""
    rng = random.Random(3)
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE * 2, rng)
    mixed = []
    for i, t in enumerate(ids):
        mixed.append(t)
        if i % 9 == 0:
            mixed.append(rng.choice([0, 1]))
    check(tok, mixed, [1] * len(mixed))


@pytest.mark.parametrize("seed", range(3))
def test_leading_space_stripping_tokenizer(seed):
    """A SentencePiece-like decode that drops the text's first space: the window slide must not
    lose the space in front of the window's first token."""
    rng = random.Random(seed)
    tok = ByteTokenizer(strip_leading_space=True)
    words = [rng.choice(["alpha", "béta", "gamma", "δέλτα", "中文", "x"]) for _ in range(120)]
    ids = []
    for w in words:
        ids += tok.encode(" " + w, rng)
    check(tok, ids, [1] * len(ids))
    check(tok, ids, [rng.randint(1, 12) for _ in range(len(ids))])


def test_decode_window_stays_bounded():
    """Each push decodes a bounded window, not the whole history (the point of the window)."""

    class Counting(ByteTokenizer):
        def decode(self, ids, skip_special_tokens=False):
            self.longest = max(getattr(self, "longest", 0), len(ids))
            return super().decode(ids, skip_special_tokens)

    tok = Counting()
    ids = tok.encode(SAMPLE * 4, random.Random(1), max_piece=1)
    assert len(ids) > 400
    dec = IncrementalDecoder(tok)
    for t in ids:
        dec.push([t])
    assert tok.longest <= 80


# -- ReplyText: deltas safe under stop strings, the final text never loses bytes ---------------


def reply_deltas(reply: ReplyText, ids: list[int]) -> list[str]:
    return [reply.push([token]) for token in ids] + [reply.finish()]


@pytest.mark.parametrize("seed", range(3))
def test_reply_cut_at_every_length_keeps_every_byte(seed):
    """A reply that ends inside a multi-byte character still ends with all of its text: the
    final text is the decoding of every token, and the deltas add up to it."""
    tok = ByteTokenizer()
    ids = tok.encode("emoji 😀🚀 and 中文 " * 2, random.Random(seed))
    for end in range(1, len(ids) + 1):
        reply = ReplyText(tok)
        deltas = reply_deltas(reply, ids[:end])
        full = tok.decode(ids[:end], skip_special_tokens=True)
        assert "".join(deltas) == full == reply.text()
        assert all("\ufffd" not in d for d in deltas[:-1])


@pytest.mark.parametrize("seed", range(4))
def test_reply_stops_before_the_first_stop_string(seed):
    tok = ByteTokenizer()
    text = "Step one: mix. Step two: bake. Step three: eat."
    ids = tok.encode(text, random.Random(seed))
    reply = ReplyText(tok, stops=["Step three", "bake."])
    deltas = reply_deltas(reply, ids)
    assert "".join(deltas) == reply.text() == "Step one: mix. Step two: "
    assert reply.stopped
    # Nothing past the cut was ever sent, even for a moment.
    sent = ""
    for delta in deltas:
        sent += delta
        assert "Step one: mix. Step two: ".startswith(sent)


def test_reply_holds_back_only_what_may_become_a_stop_string():
    tok = ByteTokenizer()
    ids = tok.encode("abc<en", random.Random(0), max_piece=1)
    reply = ReplyText(tok, stops=["<end>"])
    assert "".join(reply.push([t]) for t in ids) == "abc"  # "<en" may still become "<end>"
    assert reply.finish() == "<en"  # generation ended without it: the text is whole
    assert not reply.stopped


def test_open_stop_tail_and_first_stop():
    assert open_stop_tail("hello wor", ["world"]) == 3
    assert open_stop_tail("hello", ["world"]) == 0
    assert open_stop_tail("ab", ["b", "abc"]) == 2
    assert first_stop("one two three", ["three", "two"]) == 4
    assert first_stop("one", ["two"]) is None


def test_real_byte_level_tokenizer_cut_at_every_length(smollm2_tokenizer_dir):
    """SmolLM2's byte-level BPE splits emoji and CJK over several tokens: every prefix of the
    token list streams to exactly its decoding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    ids = tok.encode("Fire 🔥, rocket 🚀, wave 🌊; 中文字符和日本語 ✓ Ærø", add_special_tokens=False)
    for end in range(1, len(ids) + 1):
        dec = IncrementalDecoder(tok)
        text = "".join(dec.push([t]) for t in ids[:end]) + dec.finish()
        assert text == tok.decode(ids[:end], skip_special_tokens=True)
