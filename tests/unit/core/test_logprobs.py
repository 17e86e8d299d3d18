"""Log-probabilities from the verification logits equal those of `generate`'s own logits, token
for token, also for tokens that were accepted drafts (read at a tree node, not a one-token step)."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core import StopCondition, TokenRecyclingDecoder, TreeSpec
from tr_cli.core.drafters import Draft, Drafter

from tiny_models import EOS, random_prompt, reference_with_logprobs, tiny_model


class Chain(Drafter):
    """Drafts the known continuation, every third token spoiled: some drafts accepted, some not."""

    name = "chain"

    def __init__(self, continuation: list[int], prompt_length: int) -> None:
        self.continuation, self.prompt_length, self.seen = continuation, prompt_length, []
        self.spec = TreeSpec.chain("chain3", 3)

    def propose(self, root: int) -> Draft | None:
        done = len(self.seen) - self.prompt_length
        upcoming = self.continuation[done : done + 3]
        if len(upcoming) < 3:
            return None
        upcoming = [t + 1 if (done + i) % 3 == 2 else t for i, t in enumerate(upcoming)]
        return Draft(self.spec, torch.tensor([root, *upcoming]))

    def extend(self, tokens: list[int]) -> None:
        self.seen += tokens

    def reset(self) -> None:
        self.seen = []

    max_nodes = 3
    max_depth = 3

    def describe(self) -> str:
        return "chain 3"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logprobs_are_generates_own(arch):
    model = tiny_model(arch)
    ids = random_prompt(12, seed=5)
    tokens, reference = reference_with_logprobs(model, ids, 30)
    decoder = TokenRecyclingDecoder(model, tree=TreeSpec.from_paths("small", [[0], [1]]))
    decoder.drafters.append(Chain(tokens, len(ids)))
    decoder.set_logprobs(5)
    result = decoder.generate(ids, StopCondition.build(30, [EOS]), keep_events=True)
    assert result.tokens == tokens
    assert any(e.accepted_tokens for e in result.events), "no draft was accepted: the test reads no tree node"
    entries = [entry for event in result.events for entry in event.logprobs]
    assert [entry.token for entry in entries] == tokens
    for i, entry in enumerate(entries):
        assert entry.logprob == pytest.approx(reference[i, entry.token].item(), abs=1e-4)
        best = torch.topk(reference[i], 5)
        assert [v for _, v in entry.top] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert [reference[i, t].item() for t, _ in entry.top] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert entry.top[0][0] == entry.token  # greedy: the chosen token is the most likely


def test_logprobs_are_off_unless_asked_for_and_bounded():
    model = tiny_model("llama")
    decoder = TokenRecyclingDecoder(model, tree=TreeSpec.from_paths("one", [[0]]))
    events = decoder.generate(random_prompt(8, seed=1), StopCondition.build(6, [EOS]), keep_events=True).events
    assert all(event.logprobs is None for event in events)
    decoder.reset()
    decoder.set_logprobs(0)  # the chosen token's only
    events = decoder.generate(random_prompt(8, seed=1), StopCondition.build(6, [EOS]), keep_events=True).events
    assert all(len(event.logprobs) == len(event.new_tokens) for event in events)
    assert all(entry.top == () and entry.logprob <= 0 for event in events for entry in event.logprobs)
    with pytest.raises(ValueError, match="0 to 20"):
        decoder.set_logprobs(21)
