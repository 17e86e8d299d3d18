"""The Token Recycling decode loop, as a generator of step events.

Per step (Medusa's loop: candidates -> tree decoding -> evaluate -> update): every drafter proposes
a small tree under the last emitted token and the proposals are merged under one root -> one
forward pass over the merged tree (position ids = prefix + depth, a 4D ancestor mask) -> accept
the longest right path plus the model's bonus token (greedy, or the exact sampling walk) -> every
drafter learns from the outcome (the matrix takes the top-k after every node) -> the KV cache
keeps only the accepted path. Chat, the live view, bench and `tr generate` consume the events.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from .attention import AttentionLayout, causal_visibility
from .bounded_cache import BoundedCache
from .constraint import TokenConstraint, allowed_nodes, masked_argmax
from .design.acceptance_stats import AcceptanceStats
from .design.cost_model import CALIBRATION_SIZES, CostModel, calibrate
from .design.source_stats import SourceStats
from .drafters.base import Drafter, Placement, Verification
from .drafters.grammar_chain import MAX_CHAIN as GRAMMAR_CHAIN
from .drafters.grammar_chain import TURN_CHAIN, GrammarChainDrafter, GrammarRecord
from .drafters.matrix_tree import MatrixTreeDrafter
from .drafters.merge import DraftMerger, TreeMerge
from .drafters.planner import DraftPlanner
from .drafters.text_lookup import TEXT_DEPTH, TEXT_PRIOR, TextLookupDrafter
from .errors import PrefillStopped
from .events import GenerationResult, GenerationStats, StepEvent, StepTimings, track
from .forward import make_forward
from .kv_cache import KEEP_ROWS, CompactingCache, RowKeeper
from .logprobs import MAX_TOP, TokenLogprob, token_logprobs
from .matrix import DEFAULT_K, new_matrix, output_vocab_size
from .sampling import Sampler
from .sampling_config import SamplingConfig
from .step_scope import decoding_step
from .stopping import StopCondition
from .tree import PRESETS, TreeSpec
from .tree_buffers import TreeBuffers
from .verify import ROW_TOPK, Acceptance, RowTopK, TopCandidates, constrained_greedy_accept, greedy_accept

PREFILL_CHUNK = 512


def prefill_chunks(length: int, most: int = PREFILL_CHUNK) -> list[tuple[int, int]]:
    """[start, stop) spans of at most `most` tokens, as even as possible: a long prompt never
    leaves a one-token last chunk, which models/weights.py's `+bf16` modes would run on the
    quantized weights while `generate`'s one-call prefill runs the whole prompt on bfloat16."""
    count = -(-length // most)
    if count == 0:
        return []
    bounds = [length * i // count for i in range(count + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


class PrefillLearning(Enum):
    """Which prompt positions' top-k candidates the drafters that learn from a prefill (the matrix)
    take: every one (the paper's; the head and a top-k for every prompt token, a quarter to a third
    of a prefill's work on CPUs), only those a prefill computes anyway (each chunk's last), or none."""

    EVERY_ROW = "every row"
    COMPUTED_ROWS = "computed rows"
    NONE = "none"


# How deep the drafts a constraint adds reach (set_constraint): the grammar's chain and branches,
# and text lookup. What a caller reserves past the reply for constrained decoding.
CONSTRAINED_DEPTH = max(GRAMMAR_CHAIN, 1 + TURN_CHAIN, TEXT_DEPTH)


@dataclass(frozen=True)
class _Step:
    """One verified step, before stop conditions cut what it emits."""

    tokens: torch.Tensor  # (n+1,) the merged tree's tokens, root first
    tree: TreeSpec
    acceptance: Acceptance
    timings: StepTimings
    placements: dict[int, Placement]  # by drafter index: where its nodes sat in the merged tree
    logprobs: list[TokenLogprob] | None  # of the accepted tokens and the bonus, when asked for


def _cache_keyword(model: torch.nn.Module) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; pass whichever the model takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TokenRecyclingDecoder:
    """Holds one conversation's state: KV cache, the pending token and the drafters.

    Batch size 1. The last emitted token stays "pending" (not yet in the KV cache): it is the root
    of the next tree, or the first input of the next turn, so a chat continues from the cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        matrix: torch.Tensor | None = None,
        tree: TreeSpec | None = None,
        k: int = DEFAULT_K,
        prefill_learning: PrefillLearning = PrefillLearning.EVERY_ROW,
        *,
        cost: CostModel | Callable[[TokenRecyclingDecoder], CostModel] | None = None,
        acceptance: AcceptanceStats | None = None,
        sampling: SamplingConfig | None = None,
        drafters: Sequence[Drafter] = (),
    ) -> None:
        """The matrix tree, Token Recycling's own source, drafts first: `tree` fixes its shape;
        without it, a `cost` model lets it be designed (and redesigned) for this device from the
        `acceptance` statistics; with neither, the paper's tree. `cost` may also be a function
        measuring it with this decoder (calibration runs its forward). `drafters` are the further
        sources (prompt lookup, the recycled store: drafters/plan.py builds them from a DraftPlan),
        verified in the same forward pass. With a cost model every step is planned: each source's
        nodes are priced by how often that source has been right, and only nodes that pay for
        their share of t(N) are verified."""
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.vocab_size = output_vocab_size(model)
        if matrix is None:
            matrix = new_matrix(self.vocab_size, k, self.device)
        if matrix.shape[0] != self.vocab_size:
            raise ValueError(f"matrix has {matrix.shape[0]} rows but the model's vocabulary has {self.vocab_size}")
        self.matrix = matrix.to(self.device)
        self.k = self.matrix.shape[1]
        # A designed tree replaces the initial one at once: start from none (valid for any k).
        initial = PRESETS["none"] if tree is None and cost is not None else tree
        self.prefill_learning = prefill_learning
        learns = prefill_learning is not PrefillLearning.NONE
        self.matrix_tree = MatrixTreeDrafter(self.matrix, initial, acceptance, seed_from_prompt=learns)
        self.drafters: list[Drafter] = [self.matrix_tree, *drafters]
        # How the grammar's drafts and text lookup fared, across constrained replies.
        self._grammar_record = GrammarRecord()
        self._text_stats = SourceStats(TEXT_PRIOR)
        self.merge: TreeMerge = DraftMerger(self.device)  # a DraftPlanner once a cost model is in use
        dtype = next(model.parameters()).dtype
        self.layout = AttentionLayout.from_config(model.config, dtype, self.device)
        self.forward_pass = make_forward(model, _cache_keyword(model))
        self.row_topk: RowTopK | None = getattr(model, ROW_TOPK, None)  # a faster top-k (verify.py)
        self.keep_rows: RowKeeper | None = getattr(model, KEEP_ROWS, None)  # a faster compaction (kv_cache.py)
        self.set_sampling(sampling)
        self.set_logprobs(None)
        self.constraint: TokenConstraint | None = None
        self._pruned: BoundedCache[TreeBuffers] = BoundedCache(64)  # trees cut to what a grammar allows
        self.reset()
        if tree is None and cost is not None:
            self.use_cost_model(cost(self) if callable(cost) else cost)

    # -- configuration ---------------------------------------------------------------------

    @property
    def tree(self) -> TreeSpec:
        """The matrix tree drafted next."""
        return self.matrix_tree.spec

    @property
    def acceptance(self) -> AcceptanceStats:
        return self.matrix_tree.acceptance

    @property
    def designed(self) -> bool:
        """Whether the matrix tree is designed for this device (a cost model is in use)."""
        return self.matrix_tree.auto is not None

    def describe(self) -> str:
        """The draft sources in one phrase, e.g. 'tree auto23 (23 nodes, designed for this
        device) + lookup chain 10'."""
        return " + ".join(drafter.describe() for drafter in self.drafters)

    def use_cost_model(self, cost: CostModel) -> None:
        """Plan every step for this cost model: the matrix tree designed from its statistics, and
        each source's nodes verified only where they pay."""
        self.matrix_tree.design_for(cost)
        self.merge = DraftPlanner(cost, self.device)

    def set_sampling(self, sampling: SamplingConfig | None) -> None:
        """Greedy (None, or temperature 0) or sampled decoding from the next token on; a sampling
        config starts its random stream afresh from its seed."""
        self.sampling = sampling if sampling is not None else SamplingConfig.greedy()
        self.sampler = None if self.sampling.is_greedy else Sampler(self.sampling)

    def set_logprobs(self, top: int | None) -> None:
        """From the next token on, give each emitted token's log-probability and the `top` most
        likely tokens there (0 to MAX_TOP) in the step events; None: none (nothing computed)."""
        if top is not None and not 0 <= top <= MAX_TOP:
            raise ValueError(f"top log-probabilities: 0 to {MAX_TOP}, got {top}")
        self.logprob_top = top

    def set_constraint(self, constraint: TokenConstraint | None) -> None:
        """Constrain the next reply (from its first token) by a grammar, in its initial state; None:
        unconstrained. While set, drafts the grammar forbids are cut before the forward
        (core/constraint.py), and a decoder that drafts also drafts what the grammar forces or
        offers (drafters/grammar_chain.py) and, when the constraint knows the tokens' text, values
        copied from the prompt's text (drafters/text_lookup.py); these reach CONSTRAINED_DEPTH
        deep. One that drafts nothing (`ar`) stays one token per forward."""
        self.drafters = [d for d in self.drafters if not isinstance(d, GrammarChainDrafter | TextLookupDrafter)]
        self.constraint = constraint
        if constraint is not None and self.max_depth > 0:
            self.drafters.append(GrammarChainDrafter(constraint, self.device, record=self._grammar_record))
            if constraint.token_text is not None:
                text = TextLookupDrafter(constraint.token_text, device=self.device, stats=self._text_stats)
                text.extend(self.tokens)  # the conversation so far (a cached prefix is not fed again)
                self.drafters.append(text)

    def _logprobs(self, logits: torch.Tensor, rows: list[int], tokens: list[int]) -> list[TokenLogprob] | None:
        return None if self.logprob_top is None else token_logprobs(logits, rows, tokens, self.logprob_top)

    def reset(self) -> None:
        """Forget the conversation (the matrix stays)."""
        self.cache = CompactingCache(self.keep_rows)
        self.pending: int | None = None
        self.tokens: list[int] = []
        for drafter in self.drafters:
            drafter.reset()

    @torch.inference_mode()
    def rewind(self, keep: int) -> None:
        """Cut the conversation back to its first `keep` tokens, so that a request sharing only a
        prefix with it (an edited or branched chat) reuses that much of the KV cache. The last
        kept token becomes the pending one; the rest is as if the conversation had ended there."""
        if not 0 <= keep <= len(self.tokens):
            raise ValueError(f"cannot keep {keep} tokens of a conversation of {len(self.tokens)}")
        if keep == len(self.tokens):
            return
        if keep == 0:
            self.reset()
            return
        kept = self.tokens[:keep]
        self.cache.truncate(keep - 1)
        self.tokens = kept
        self.pending = kept[-1]
        for drafter in self.drafters:
            drafter.rewind(kept)

    def shared_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` the conversation already holds."""
        count = 0
        for held, new in zip(self.tokens, ids, strict=False):
            if held != new:
                break
            count += 1
        return count

    @property
    def cached_length(self) -> int:
        return self.cache.length

    @property
    def max_depth(self) -> int:
        """How far past the cache a step's positions can reach."""
        return max(drafter.max_depth for drafter in self.drafters)

    # -- the forward pass ------------------------------------------------------------------

    def _append(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        for drafter in self.drafters:
            drafter.extend(tokens)

    def _mask(self, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor | dict:
        """The 4D additive mask (or one per layer type) for new tokens at `positions` over the cache."""
        return self.layout.build(self.cache.length, positions, visible)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | dict, last_only: bool = False
    ) -> torch.Tensor:
        return self.forward_pass(input_ids, positions, mask, self.cache, last_only)

    def _forward_causal(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append plain new tokens after the cache, each seeing the cache and the tokens before it;
        the logits of every new token, or (`last_only`) of the last one."""
        positions = torch.arange(ids.shape[0], device=self.device) + self.cache.length
        visible = causal_visibility(ids.shape[0], self.device)
        return self._forward(ids, positions, self._mask(positions, visible), last_only)

    def _accepted_by_source(self, placements: dict[int, Placement], nodes: list[int]) -> dict[str, int]:
        """How many of the emitted draft `nodes` (merged indices) each source had proposed."""
        counts: dict[str, int] = {}
        if nodes:
            emitted = set(nodes)
            for index, placement in placements.items():
                hits = len(emitted.intersection(placement.nodes))
                if hits:
                    name = self.drafters[index].name
                    counts[name] = counts.get(name, 0) + hits
        return counts

    def _nodes_by_source(self, placements: dict[int, Placement]) -> dict[str, tuple[int, ...]]:
        """Each source's nodes (merged indices); two drafters of one name share an entry."""
        nodes: dict[str, tuple[int, ...]] = {}
        for index, placement in placements.items():
            name = self.drafters[index].name
            nodes[name] = nodes.get(name, ()) + placement.nodes
        return nodes

    def _learn(self, verification: Verification, placements: dict[int, Placement]) -> None:
        for index, drafter in enumerate(self.drafters):
            drafter.learn(verification, placements.get(index))

    @torch.inference_mode()
    def _prefill(
        self, ids: list[int], stop_requested: Callable[[], bool] | None
    ) -> tuple[int, list[TokenLogprob] | None, StepTimings]:
        """Run new tokens through the model in chunks; return the next token (greedy or sampled).
        `stop_requested` is asked before each chunk: a long prompt nobody waits for any more
        stops there (PrefillStopped), the cache keeping the chunks already read."""
        t0 = time.perf_counter()
        update = 0.0
        learners = [drafter for drafter in self.drafters if drafter.learns_from_prefill]
        every_row = bool(learners) and self.prefill_learning is PrefillLearning.EVERY_ROW
        last_logits = None
        for start, stop in prefill_chunks(len(ids)):
            if stop_requested is not None and stop_requested():
                self.rewind(self.cache.length + 1)  # the first token not cached becomes the pending one
                raise PrefillStopped(start, len(ids))
            chunk = torch.tensor(ids[start:stop], dtype=torch.long, device=self.device)
            logits = self._forward_causal(chunk, last_only=not every_row)
            last_logits = logits[-1]
            if learners:
                u0 = time.perf_counter()
                top = TopCandidates.of(logits, self.k, self.row_topk)
                verification = Verification(chunk[-logits.shape[0] :], top.indices, None, None)
                for drafter in learners:
                    drafter.learn(verification, None)
                update += time.perf_counter() - u0
        first = self._first_token(last_logits)
        logprobs = self._logprobs(last_logits.view(1, -1), [0], [first])
        total = time.perf_counter() - t0
        return first, logprobs, StepTimings(forward=total - update, update=update)

    def _first_token(self, logits: torch.Tensor) -> int:
        """The token after a prefill: greedy or sampled, among what the grammar allows if one is set."""
        constraint = self.constraint
        if constraint is None:
            return self.sampler.first_token(logits, self.tokens) if self.sampler else int(logits.argmax())
        if self.sampler:
            token = self.sampler.first_token(logits, self.tokens, constraint.allowed().to(logits.device))
        else:
            values, indices = torch.topk(logits, self.k)
            token = masked_argmax(logits, values.tolist(), indices.tolist(), constraint)
        constraint.advance(token)
        return token

    def _allowed_only(
        self, buffers: TreeBuffers, tokens: torch.Tensor, placements: tuple[Placement, ...]
    ) -> tuple[TreeBuffers, torch.Tensor, tuple[Placement, ...]]:
        """The merged tree without the nodes the grammar forbids (and their subtrees)."""
        kept = allowed_nodes(buffers.spec, tokens.tolist(), self.constraint)
        if len(kept) == buffers.size:
            return buffers, tokens, placements
        spec = buffers.spec.subset(kept)
        pruned = self._pruned.get(spec, lambda: TreeBuffers.build(spec, self.device))
        new_index = {old: new for new, old in enumerate(kept)}
        placements = tuple(
            Placement(tuple(new_index.get(node, -1) if node > 0 else -1 for node in placement.nodes))
            for placement in placements
        )
        index = torch.tensor(kept, dtype=torch.long, device=tokens.device)
        return pruned, tokens.index_select(0, index), placements

    def _draft(self) -> tuple[TreeBuffers, torch.Tensor, dict[int, Placement]]:
        """Every drafter's proposal, merged under the pending token."""
        root = self.pending
        drafts, owners = [], []
        for index, drafter in enumerate(self.drafters):
            draft = drafter.propose(root)
            if draft is not None:
                drafts.append(draft)
                owners.append(index)
        buffers, tokens, placements = self.merge.plan(root, drafts)
        if self.constraint is not None:
            buffers, tokens, placements = self._allowed_only(buffers, tokens, placements)
        return buffers, tokens, dict(zip(owners, placements, strict=True))

    @torch.inference_mode()
    def _step(self) -> _Step:
        t0 = time.perf_counter()
        buffers, tokens, placements = self._draft()
        positions = buffers.depths + self.cache.length
        mask = self._mask(positions, buffers.ancestor_mask)
        t1 = time.perf_counter()
        with decoding_step():
            logits = self._forward(tokens, positions, mask)
        t2 = time.perf_counter()
        # One top-k serves acceptance and the matrix update.
        top = TopCandidates.of(logits, self.k, self.row_topk)
        if self.sampler:  # the exact sampling walk (sampling.py); the conversation is its context
            acceptance = self.sampler.accept(tokens, logits, buffers, self.tokens, self.constraint)
        elif self.constraint is not None:
            acceptance = constrained_greedy_accept(tokens, logits, buffers, top, self.constraint)
        else:
            acceptance = greedy_accept(tokens, logits, buffers, top.argmax(logits))
        # Each emitted token's distribution: its parent's row (the root's for the first).
        emitted = [*acceptance.tokens, acceptance.bonus]
        logprobs = self._logprobs(logits, [0, *acceptance.nodes], emitted)
        t3 = time.perf_counter()
        self._learn(Verification(tokens, top.indices, acceptance.correct, buffers, acceptance.right_paths), placements)
        t4 = time.perf_counter()
        self.merge.observe(t4 - t0, len(acceptance.nodes), buffers.size - 1)
        timings = StepTimings(draft=t1 - t0, forward=t2 - t1, verify=t3 - t2, update=t4 - t3)
        return _Step(tokens, buffers.spec, acceptance, timings, placements, logprobs)

    # -- calibration -----------------------------------------------------------------------

    @torch.inference_mode()
    def measure_cost(
        self, sizes: tuple[int, ...] = CALIBRATION_SIZES, context: int = 256, repeats: int = 3
    ) -> CostModel:
        """Calibrate t(N): time forwards of N tokens (plus verification's top-k) over a scratch
        cache of `context` random tokens. The conversation's own cache is left untouched."""
        saved = self.cache
        self.cache = CompactingCache()
        try:
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, self.vocab_size, (context + max(sizes),), generator=g).to(self.device)
            self._forward_causal(ids[:context])

            def run_step(n: int) -> None:
                with decoding_step():
                    logits = self._forward_causal(ids[context : context + n])
                top = TopCandidates.of(logits, self.k, self.row_topk)
                top.argmax(logits).cpu()  # waits for the device
                self.cache.crop(context)

            return calibrate(run_step, sizes, repeats)
        finally:
            self.cache = saved

    # -- the loop --------------------------------------------------------------------------

    @torch.inference_mode()
    def _keep_path(self, root_at: int, nodes: list[int]) -> None:
        """Cache keeps the root and the accepted nodes before the new pending (last emitted) token."""
        kept = [0, *nodes]
        if kept == list(range(len(kept))):  # already in place (often: no draft accepted, or the first chain)
            self.cache.truncate(root_at + len(kept))
        else:
            self.cache.keep(root_at, torch.tensor(kept, dtype=torch.long, device=self.device))

    def steps(
        self, input_ids: list[int], stop: StopCondition, stop_requested: Callable[[], bool] | None = None
    ) -> Iterator[StepEvent]:
        """Append `input_ids` to the conversation and generate; yields one event per forward pass.
        Between events the caller stops by closing the generator; during the prefill, which may
        take many seconds before the first event, by `stop_requested` (see `_prefill`)."""
        if not input_ids and self.pending is None:
            raise ValueError("nothing to continue from: give input tokens")
        feed = ([self.pending] if self.pending is not None else []) + list(input_ids)
        self._append(list(input_ids))
        generated: list[int] = []

        first, first_logprobs, timings = self._prefill(feed, stop_requested)
        self.pending = first
        _, reason = stop.cut(generated, [first])
        generated.append(first)
        self._append([first])
        yield StepEvent(
            step=0,
            tree_tokens=None,
            tree=None,
            accepted_nodes=[],
            accepted_tokens=[],
            bonus=first,
            new_tokens=[first],
            timings=timings,
            finish_reason=reason,
            logprobs=first_logprobs,
        )

        number = 0
        while reason is None:
            number += 1
            root_at = self.cache.length
            step = self._step()
            accepted = step.acceptance
            keep, reason = stop.cut(generated, [*accepted.tokens, accepted.bonus])
            emitted = [*accepted.tokens, accepted.bonus][:keep]
            t0 = time.perf_counter()
            self._keep_path(root_at, accepted.nodes[: keep - 1])
            compact = time.perf_counter() - t0
            self.pending = emitted[-1]
            generated.extend(emitted)
            self._append(emitted)
            yield StepEvent(
                step=number,
                tree_tokens=step.tokens.cpu(),
                tree=step.tree,
                accepted_nodes=accepted.nodes[:keep],
                accepted_tokens=accepted.tokens[:keep],
                bonus=accepted.bonus if keep > len(accepted.tokens) else None,
                new_tokens=emitted,
                timings=step.timings + StepTimings(update=compact),
                finish_reason=reason,
                accepted_by_source=self._accepted_by_source(step.placements, accepted.nodes[:keep]),
                nodes_by_source=self._nodes_by_source(step.placements),
                logprobs=None if step.logprobs is None else step.logprobs[:keep],
            )

    def generate(self, input_ids: list[int], stop: StopCondition, keep_events: bool = False) -> GenerationResult:
        """The generated tokens and their stats (a plain run of `steps`)."""
        result = GenerationResult(stats=GenerationStats(prompt_tokens=len(input_ids)))
        for _ in track(self.steps(input_ids, stop), result, keep_events):
            pass
        return result
