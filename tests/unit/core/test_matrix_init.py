"""Building a matrix from text (core/matrix_init.py): each position's top-k lands in its token's row,
the same whether the chunks go through the model together (a model that takes batches) or one by
one (tr's row attention and fused layers take batch 1)."""

import torch

from tr_cli.core.forward import takes_batches
from tr_cli.core.matrix import new_matrix, update_rows
from tr_cli.core.matrix_init import fill_from_token_lists
from tr_cli.core.verify import TopCandidates
from tr_cli.models import WeightsMode
from tr_cli.models.weights import quantize

from tiny_models import VOCAB, random_prompt, tiny_model

K = 4


def one_by_one(model, lists):
    """The matrix written list by list, each through the model alone (longest first, as filled)."""
    matrix = new_matrix(VOCAB, K, torch.device("cpu"))
    with torch.inference_mode():
        for ids in sorted(lists, key=len, reverse=True):
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            update_rows(matrix, torch.tensor(ids), TopCandidates.of(logits, K).indices)
    return matrix


def filled(model, lists):
    matrix = new_matrix(VOCAB, K, torch.device("cpu"))
    assert fill_from_token_lists(model, matrix, lists) == sum(len(ids) for ids in lists)
    return matrix


LISTS = [random_prompt(30, seed=1), random_prompt(21, seed=2), random_prompt(9, seed=3)]


def test_a_model_that_takes_batches_fills_as_one_list_at_a_time():
    model = tiny_model("llama")
    assert takes_batches(model)
    assert torch.equal(filled(model, LISTS), one_by_one(model, LISTS))


def test_a_model_on_tr_kernels_is_fed_one_chunk_at_a_time(tr_kernels):
    """tr's row attention and fused layers take batch 1: several chunks as one batch failed with
    'x: (1, tokens, hidden)' (`tr matrix init` on the default weights)."""
    model = tiny_model("llama")
    quantize(model, WeightsMode.parse("int4"))
    assert not takes_batches(model)
    assert torch.equal(filled(model, LISTS), one_by_one(model, LISTS))
