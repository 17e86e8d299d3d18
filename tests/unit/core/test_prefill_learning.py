"""What a prefill gives the matrix: every prompt row's top-k (the paper's), only the rows the
prefill computes anyway (each chunk's last: what tr runs), or nothing; the reply is the same."""

import pytest
import torch

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.decode import PREFILL_CHUNK, PrefillLearning, prefill_chunks

from tiny_models import EOS, random_prompt, reference, tiny_model


def _top_k_after_each(model, ids: list[int], k: int) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.topk(logits, k, dim=-1).indices


@pytest.mark.parametrize("learning", list(PrefillLearning))
def test_the_matrix_takes_the_prefill_rows_the_choice_names(learning):
    model = tiny_model("phi3-gguf")  # a vocabulary (32,064) wide enough for two chunks of distinct tokens
    # Prompt tokens distinct, so each row is written once.
    ids = torch.randperm(model.config.vocab_size - 2, generator=torch.Generator().manual_seed(1))[: PREFILL_CHUNK + 40]
    ids = (ids + 2).tolist()
    decoder = TokenRecyclingDecoder(model, prefill_learning=learning)
    events = decoder.steps(ids, StopCondition.build(1, [EOS]))
    next(events)  # the prefill only: no step has learned anything yet
    filled = decoder.matrix.any(dim=1).nonzero().flatten().tolist()
    top = _top_k_after_each(model, ids, decoder.k)
    last_of_chunks = [stop - 1 for _, stop in prefill_chunks(len(ids))]
    assert len(last_of_chunks) == 2
    expected_rows = {
        PrefillLearning.EVERY_ROW: list(range(len(ids))),
        PrefillLearning.COMPUTED_ROWS: last_of_chunks,
        PrefillLearning.NONE: [],
    }[learning]
    assert sorted(filled) == sorted(ids[i] for i in expected_rows)
    for i in expected_rows:  # the model's best next token first (lower ranks may swap at near-ties)
        assert decoder.matrix[ids[i], 0] == top[i, 0] and len(set(decoder.matrix[ids[i]].tolist())) == decoder.k


def test_the_reply_does_not_depend_on_what_the_prefill_taught():
    model = tiny_model("qwen2")
    ids = random_prompt(60, 4)
    replies = {
        learning: TokenRecyclingDecoder(model, prefill_learning=learning)
        .generate(ids, StopCondition.build(24, [EOS]))
        .tokens
        for learning in PrefillLearning
    }
    assert set(map(tuple, replies.values())) == {tuple(reference(model, ids, 24))}
