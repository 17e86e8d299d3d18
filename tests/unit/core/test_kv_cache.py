"""After a verification step the cache holds exactly prefix + root + accepted path: the same keys
and values as decoding those tokens one by one, within float tolerance."""

import torch
from transformers import DynamicCache

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.decode import PrefillLearning
from tr_cli.core.kv_cache import CompactingCache

from tiny_models import EOS, random_prompt, reference, tiny_model


def sequential_cache(model, tokens: list[int]) -> DynamicCache:
    cache = DynamicCache()
    with torch.inference_mode():
        for token in tokens:
            model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
    return cache


def oracle_matrix(decoder: TokenRecyclingDecoder, continuation: list[int]) -> None:
    """Slot 0 of each token's row = the token that really follows it, so drafts get accepted."""
    for a, b in zip(continuation, continuation[1:], strict=False):
        decoder.matrix[a, 0] = b


def test_compacted_cache_equals_sequential_decoding():
    model = tiny_model("llama")
    ids = random_prompt(300, 3)  # longer than the initial buffer: exercises growth too
    future = reference(model, ids, 24)
    decoder = TokenRecyclingDecoder(model, prefill_learning=PrefillLearning.NONE)
    oracle_matrix(decoder, future)
    events = list(decoder.steps(ids, StopCondition.build(12, [EOS])))
    assert any(len(e.accepted_tokens) >= 2 for e in events[1:]), "no multi-token acceptance to compact"
    generated = [t for e in events for t in e.new_tokens]
    assert generated == future[:12]

    cached_tokens = ids + generated[:-1]  # the last generated token is pending
    assert decoder.cached_length == len(cached_tokens)
    expected = sequential_cache(model, cached_tokens)
    for layer, ref in zip(decoder.cache.layers, expected.layers, strict=True):
        assert layer.keys.shape == ref.keys.shape
        torch.testing.assert_close(layer.keys, ref.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(layer.values, ref.values, rtol=1e-4, atol=1e-5)


def test_eos_inside_accepted_path_leaves_no_extra_rows():
    model = tiny_model("qwen2")
    ids = random_prompt(20, 5)
    future = reference(model, ids, 30)
    eos = future[9]
    decoder = TokenRecyclingDecoder(model, prefill_learning=PrefillLearning.NONE)
    oracle_matrix(decoder, future)
    out = decoder.generate(ids, StopCondition.build(30, [eos])).tokens
    assert out == future[: future.index(eos) + 1]
    assert decoder.cached_length == len(ids) + len(out) - 1


def test_keep_moves_rows_in_place():
    cache = CompactingCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(keys, keys + 100, 0)
    cache.keep(4, torch.tensor([0, 2, 5]))
    layer = cache.layers[0]
    assert layer.get_seq_length() == 7
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 6, 9]
    assert layer.values[0, 1, :, 0].tolist() == [100, 101, 102, 103, 104, 106, 109]
    # New writes land right after the kept rows.
    cache.update(torch.full((1, 2, 1, 3), -1.0), torch.full((1, 2, 1, 3), -2.0), 0)
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 6, 9, -1]


def test_truncate_keeps_the_first_rows_without_moving_them():
    """What a step whose accepted rows already follow the prefix asks for (decode._keep_path)."""
    cache = CompactingCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(keys, keys + 100, 0)
    cache.truncate(6)
    layer = cache.layers[0]
    assert layer.get_seq_length() == 6 and layer.keys[0, 1, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    cache.update(torch.full((1, 2, 1, 3), -1.0), torch.full((1, 2, 1, 3), -2.0), 0)
    assert layer.values[0, 0, :, 0].tolist() == [100, 101, 102, 103, 104, 105, -2]
