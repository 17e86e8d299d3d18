"""The Token Recycling decode loop, as a generator of step events.

Per step: draft a tree from the matrix (retrieve), plus a prompt-lookup chain when the context's
tail occurred before -> verify it in one forward pass -> accept the longest greedy path -> update
the matrix from every node's logits -> keep only the accepted path in the KV cache. With a cost
model the tree is designed for this device and redesigned as acceptance statistics come in.
Chat, the live view and bench all consume the same events.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .acceptance_stats import AcceptanceStats
from .attention import AttentionLayout, causal_visibility
from .cost_model import CALIBRATION_SIZES, CostModel, calibrate
from .draft import draft_tree
from .kv_cache import CompactingCache
from .lookup import PromptLookup
from .matrix import DEFAULT_K, new_matrix, output_vocab_size, top_candidates, update_rows
from .sampling import Sampler, SamplingConfig
from .stopping import StopCondition
from .tree import PRESETS, TreeBuffers, TreeSpec
from .tree_design import AutoTree
from .verify import TopCandidates, greedy_accept

PREFILL_CHUNK = 512


@dataclass(frozen=True)
class StepTimings:
    """Seconds spent in each phase of one step (on CUDA, forward time partly lands in verify)."""

    draft: float = 0.0
    forward: float = 0.0
    verify: float = 0.0
    update: float = 0.0

    @property
    def total(self) -> float:
        return self.draft + self.forward + self.verify + self.update


@dataclass(frozen=True)
class StepEvent:
    """One forward pass. step 0 is the prefill, which emits the first token and drafts nothing."""

    step: int
    tree_tokens: torch.Tensor | None  # (n+1,) tokens of root + draft nodes, on the CPU
    tree: TreeSpec | None
    accepted_nodes: list[int]  # node indices of the accepted draft path (root excluded)
    accepted_tokens: list[int]
    bonus: int | None  # the model's own token after the accepted path
    new_tokens: list[int]  # what this step emits, after stop conditions
    timings: StepTimings
    finish_reason: str | None  # "eos", "length", "stop_string" on the last step


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # verification forwards (the prefill not counted)
    step_tokens: int = 0  # tokens emitted by those steps (accepted drafts + bonus)
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    draft_seconds: float = 0.0
    forward_seconds: float = 0.0
    verify_seconds: float = 0.0
    update_seconds: float = 0.0
    finish_reason: str | None = None

    @property
    def mean_accepted_tokens(self) -> float:
        """MAT: tokens per verification step, counting the bonus token (Spec-Bench's convention)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def overhead_fraction(self) -> float:
        """Share of step time spent outside the model's forward (draft, masks, verify, update, KV)."""
        step = self.draft_seconds + self.forward_seconds + self.verify_seconds + self.update_seconds
        return 1.0 - self.forward_seconds / step if step > 0 else 0.0

    def add(self, event: StepEvent) -> None:
        self.new_tokens += len(event.new_tokens)
        t = event.timings
        if event.step == 0:
            self.prefill_seconds += t.total
        else:
            self.steps += 1
            self.step_tokens += len(event.new_tokens)
            self.draft_seconds += t.draft
            self.forward_seconds += t.forward
            self.verify_seconds += t.verify
            self.update_seconds += t.update
        if event.finish_reason:
            self.finish_reason = event.finish_reason


@dataclass
class GenerationResult:
    tokens: list[int]
    stats: GenerationStats
    events: list[StepEvent] = field(default_factory=list)


def _cache_keyword(model: torch.nn.Module) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; pass whichever the model takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TokenRecyclingDecoder:
    """Holds one conversation's state: KV cache, the pending token and the shared matrix.

    Batch size 1. The last emitted token stays "pending" (not yet in the KV cache): it is the root
    of the next tree, or the first input of the next turn, so a chat continues from the cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        matrix: torch.Tensor | None = None,
        tree: TreeSpec | None = None,
        k: int = DEFAULT_K,
        seed_from_prompt: bool = True,
        *,
        cost: CostModel | None = None,
        stats: AcceptanceStats | None = None,
        lookup_length: int = 0,
        sampling: SamplingConfig | None = None,
    ) -> None:
        """`tree` fixes the draft tree; without it, a `cost` model lets the decoder design (and keep
        redesigning) the tree for this device from `stats`; with neither, the paper's tree.
        `lookup_length` > 0 adds a prompt-lookup chain of that many nodes whenever one matches."""
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.vocab_size = output_vocab_size(model)
        if matrix is None:
            matrix = new_matrix(self.vocab_size, k, self.device)
        if matrix.shape[0] != self.vocab_size:
            raise ValueError(f"matrix has {matrix.shape[0]} rows but the model's vocabulary has {self.vocab_size}")
        self.matrix = matrix.to(self.device)
        self.k = self.matrix.shape[1]
        self.stats = stats if stats is not None else AcceptanceStats(self.k, self.device)
        if stats is not None and stats.k != self.k:
            raise ValueError(f"acceptance statistics are for k={stats.k} but the matrix has k={self.k}")
        if lookup_length < 0:
            raise ValueError(f"lookup_length must be 0 or more, got {lookup_length}")
        self.lookup_length = lookup_length
        self.auto = AutoTree(self.stats, cost, self.k, extra_nodes=lookup_length) if tree is None and cost else None
        self.tree = self.auto.spec if self.auto else tree or PRESETS["paper"]
        if self.tree.max_slot >= self.k:
            raise ValueError(f"tree {self.tree.name} uses candidate slot {self.tree.max_slot} but k={self.k}")
        self._buffers: dict[TreeSpec, TreeBuffers] = {}
        self._chained: dict[TreeSpec, TreeSpec] = {}  # tree -> tree + lookup chain, built once
        dtype = next(model.parameters()).dtype
        self.layout = AttentionLayout.from_config(model.config, dtype, self.device)
        self.seed_from_prompt = seed_from_prompt
        self._cache_kw = _cache_keyword(model)
        self.set_sampling(sampling)
        self.reset()

    def set_sampling(self, sampling: SamplingConfig | None) -> None:
        """Greedy (None, or temperature 0) or sampled decoding from the next token on; a sampling
        config starts its random stream afresh from its seed."""
        self.sampling = sampling if sampling is not None else SamplingConfig.greedy()
        self.sampler = None if self.sampling.is_greedy else Sampler(self.sampling)

    def reset(self) -> None:
        """Forget the conversation (the matrix stays)."""
        self.cache = CompactingCache()
        self.pending: int | None = None
        self.tokens: list[int] = []
        self.lookup = PromptLookup()

    @property
    def cached_length(self) -> int:
        return self.cache.length

    @property
    def max_depth(self) -> int:
        """How far past the cache a step's positions can reach (tree depth or lookup chain)."""
        depth = self.auto.max_depth if self.auto else self.tree.depth
        return max(depth, self.lookup_length)

    def buffers_for(self, spec: TreeSpec) -> TreeBuffers:
        """Buffers are built once per tree spec (a designed tree changes rarely)."""
        buffers = self._buffers.get(spec)
        if buffers is None:
            buffers = self._buffers[spec] = TreeBuffers.build(spec, self.device)
        return buffers

    def _with_chain(self, tree: TreeSpec) -> TreeSpec:
        chained = self._chained.get(tree)
        if chained is None:
            chained = self._chained[tree] = tree.with_lookup(self.lookup_length)
        return chained

    @property
    def buffers(self) -> TreeBuffers:
        return self.buffers_for(self.tree)

    def _append(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        self.lookup.extend(tokens)

    def _mask(self, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor | dict:
        """The 4D additive mask (or one per layer type) for new tokens at `positions` over the cache."""
        return self.layout.build(self.cache.length, positions, visible)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | dict) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids[None],
            attention_mask=mask,
            position_ids=positions[None],
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        # With device_map="auto" the head may sit on another device than the embeddings.
        return out.logits[0].to(self.device)

    def _forward_causal(self, ids: torch.Tensor) -> torch.Tensor:
        """Append plain new tokens after the cache, each seeing the cache and the tokens before it."""
        positions = torch.arange(ids.shape[0], device=self.device) + self.cache.length
        return self._forward(ids, positions, self._mask(positions, causal_visibility(ids.shape[0], self.device)))

    @torch.inference_mode()
    def _prefill(self, ids: list[int]) -> tuple[int, StepTimings]:
        """Run new tokens through the model in chunks; return the next token (greedy or sampled)."""
        t0 = time.perf_counter()
        update = 0.0
        last_logits = None
        for start in range(0, len(ids), PREFILL_CHUNK):
            chunk = torch.tensor(ids[start : start + PREFILL_CHUNK], dtype=torch.long, device=self.device)
            logits = self._forward_causal(chunk)
            last_logits = logits[-1]
            if self.seed_from_prompt:
                u0 = time.perf_counter()
                update_rows(self.matrix, chunk, top_candidates(logits, self.k))
                update += time.perf_counter() - u0
        first = self.sampler.first_token(last_logits, self.tokens) if self.sampler else int(last_logits.argmax())
        total = time.perf_counter() - t0
        return first, StepTimings(forward=total - update, update=update)

    @torch.inference_mode()
    def _step(self) -> tuple[torch.Tensor, TreeSpec, list[int], list[int], int, StepTimings]:
        t0 = time.perf_counter()
        proposal = self.lookup.propose(self.lookup_length) if self.lookup_length else []
        spec = self._with_chain(self.tree) if proposal else self.tree
        buffers = self.buffers_for(spec)
        tokens = draft_tree(self.matrix, self.pending, buffers, proposal)
        positions = buffers.depths + self.cache.length
        mask = self._mask(positions, buffers.ancestor_mask)
        t1 = time.perf_counter()
        logits = self._forward(tokens, positions, mask)
        t2 = time.perf_counter()
        top = TopCandidates.of(logits, self.k)
        if self.sampler:  # the exact sampling walk (sampling.py); the conversation is its context
            acceptance = self.sampler.accept(tokens, logits, buffers, self.tokens)
        else:
            acceptance = greedy_accept(tokens, logits, buffers, top.argmax(logits))
        t3 = time.perf_counter()
        update_rows(self.matrix, tokens, top.indices.to(torch.int32))
        if acceptance.correct is not None:
            self.stats.record(buffers, acceptance.correct)
        if self.auto is not None:
            self.tree = self.auto.after_step()
        t4 = time.perf_counter()
        timings = StepTimings(draft=t1 - t0, forward=t2 - t1, verify=t3 - t2, update=t4 - t3)
        return tokens, spec, acceptance.nodes, acceptance.tokens, acceptance.bonus, timings

    def use_cost_model(self, cost: CostModel) -> None:
        """Switch to a tree designed for this cost model (and redesigned as statistics come in)."""
        self.auto = AutoTree(self.stats, cost, self.k, extra_nodes=self.lookup_length)
        self.tree = self.auto.spec

    @torch.inference_mode()
    def measure_cost(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, context: int = 256, repeats: int = 3) -> CostModel:
        """Calibrate t(N): time forwards of N tokens (plus verification's top-k) over a scratch
        cache of `context` random tokens. The conversation's own cache is left untouched."""
        saved = self.cache
        self.cache = CompactingCache()
        try:
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, self.vocab_size, (context + max(sizes),), generator=g).to(self.device)
            self._forward_causal(ids[:context])

            def run_step(n: int) -> None:
                logits = self._forward_causal(ids[context : context + n])
                top = TopCandidates.of(logits, self.k)
                top.argmax(logits).cpu()  # waits for the device
                self.cache.crop(context)

            return calibrate(run_step, sizes, repeats)
        finally:
            self.cache = saved

    @torch.inference_mode()
    def _keep_path(self, root_at: int, nodes: list[int]) -> None:
        """Cache keeps the root and the accepted nodes before the new pending (last emitted) token."""
        offsets = torch.tensor([0] + nodes, dtype=torch.long, device=self.device)
        self.cache.keep(root_at, offsets)

    def steps(self, input_ids: list[int], stop: StopCondition) -> Iterator[StepEvent]:
        """Append `input_ids` to the conversation and generate; yields one event per forward pass."""
        if not input_ids and self.pending is None:
            raise ValueError("nothing to continue from: give input tokens")
        feed = ([self.pending] if self.pending is not None else []) + list(input_ids)
        self._append(list(input_ids))
        generated: list[int] = []

        first, timings = self._prefill(feed)
        self.pending = first
        keep, reason = stop.cut(generated, [first])
        generated.append(first)
        self._append([first])
        yield StepEvent(0, None, None, [], [], first, [first], timings, reason)

        step = 0
        while reason is None:
            step += 1
            root_at = self.cache.length
            tokens, spec, nodes, accepted, bonus, timings = self._step()
            emitted = accepted + [bonus]
            keep, reason = stop.cut(generated, emitted)
            emitted = emitted[:keep]
            t0 = time.perf_counter()
            self._keep_path(root_at, nodes[: keep - 1])
            compact = time.perf_counter() - t0
            self.pending = emitted[-1]
            generated.extend(emitted)
            self._append(emitted)
            timings = StepTimings(timings.draft, timings.forward, timings.verify, timings.update + compact)
            bonus_emitted = bonus if keep > len(accepted) else None
            yield StepEvent(
                step, tokens.cpu(), spec, nodes[:keep], accepted[:keep], bonus_emitted, emitted, timings, reason
            )

    def generate(self, input_ids: list[int], stop: StopCondition, keep_events: bool = False) -> GenerationResult:
        """Plain wrapper over `steps`: the generated tokens and their stats."""
        stats = GenerationStats(prompt_tokens=len(input_ids))
        events: list[StepEvent] = []
        out: list[int] = []
        t0 = time.perf_counter()
        for event in self.steps(input_ids, stop):
            out.extend(event.new_tokens)
            stats.add(event)
            if keep_events:
                events.append(event)
        stats.wall_seconds = time.perf_counter() - t0
        return GenerationResult(out, stats, events)
