"""A tokenizer stand-in for store tests: just the vocabulary and special tokens a fingerprint reads."""

VOCAB, K = 64, 4  # the vocabulary size and k of the matrices these tests write


class FakeTokenizer:
    def __init__(self, shift: int = 0):
        self.vocab = {f"tok{i + shift}": i for i in range(VOCAB)}
        self.special_tokens_map = {"eos_token": "tok2"}

    def get_vocab(self):
        return dict(self.vocab)
