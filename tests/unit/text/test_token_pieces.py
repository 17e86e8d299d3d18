"""Tokens one at a time: their text, and their exact bytes even where a token holds part of a
character (byte-level BPE) or one byte (SentencePiece's byte fallback)."""

from transformers import AutoTokenizer

from tr_cli.text.token_pieces import TokenPieces


def test_byte_level_tokens_spell_the_text_byte_for_byte(smollm2_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    pieces = TokenPieces(tokenizer)
    text = "日本語 😀 naïve tokens, ½ and \t\n done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert pieces.byte_level
    assert any("\ufffd" in pieces.text(i) for i in ids)  # some tokens hold part of a character
    assert b"".join(pieces.bytes(i) for i in ids).decode("utf-8") == text
    eos = tokenizer.eos_token_id
    assert eos in pieces.special and pieces.bytes(eos) == pieces.text(eos).encode()


class SentencePieceLike:
    """What TokenPieces asks of a SentencePiece tokenizer with byte fallback (no fast backend)."""

    vocab = {0: "<s>", 1: "▁hello", 2: "<0xE6>", 3: "<0x97>", 4: "<0xA5>", 5: "▁wörld"}
    all_special_ids = [0]

    def convert_ids_to_tokens(self, token: int) -> str:
        return self.vocab[token]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids).replace("▁", " ")


def test_byte_fallback_and_word_boundaries():
    pieces = TokenPieces(SentencePieceLike())
    assert not pieces.byte_level
    assert b"".join(pieces.bytes(i) for i in (1, 2, 3, 4, 5)).decode("utf-8") == " hello日 wörld"
    assert pieces.bytes(0) == b"<s>"
