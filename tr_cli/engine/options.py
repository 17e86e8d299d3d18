"""What a user chooses about decoding, as one typed value made once at the edge.

`DecodingOptions.parse` takes the settings as given (names and numbers, as a command line or a
config would hold them), checks them all before any model loads, and resolves them: the device,
dtype and weights mode into one `Runtime`, the tree and draft sources into one `DraftPlan`, the
sampling settings into one `SamplingRequest`. Errors are SettingErrors naming the setting; each
surface words it (cli/errors.py: as a flag). A new setting is a field here, its parsing in
`parse`, its declaration where the surface declares the others (cli/options.py), and the code
that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.drafters.plan import MAX_DEPTH, DraftPlan
from ..core.errors import InvalidTree, SettingError
from ..core.matrix_width import DEFAULT_K
from ..core.sampling_config import SamplingRequest
from ..models.resolve import resolve_model
from ..models.weights_mode import AUTO

if TYPE_CHECKING:  # resolving a runtime imports torch: only when options are parsed
    from ..models.runtime import Runtime

DEFAULT_MAX_NEW_TOKENS = 512  # a reply's length unless asked otherwise (a server request's max_tokens wins)
# Sane bounds, checked before anything is allocated: the matrix is |V| x k ids (k = 100,000 asked
# for 19.7 GB on a 49k vocabulary).
MAX_K = 64


def _default_runtime() -> Runtime:
    from ..models.runtime import Runtime

    return Runtime.resolve()


@dataclass(frozen=True)
class DecodingOptions:
    """Everything that decides how a model decodes for a user."""

    model: str | None = None  # None: the packaged default
    runtime: Runtime = field(default_factory=_default_runtime)  # device, dtype, weights
    drafts: DraftPlan = field(default_factory=DraftPlan.of)  # the tree and further draft sources
    k: int = DEFAULT_K  # candidates kept per matrix row
    matrix: Path | None = None  # None: the model's own matrix file
    cold: bool = False  # start from an empty matrix (the stored one is not read)
    save: bool = True  # write the matrix back
    sampling: SamplingRequest = field(default_factory=SamplingRequest)  # nothing asked: greedy
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS

    @classmethod
    def parse(
        cls,
        *,
        model: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        weights: str = AUTO,
        tree: str = "auto",
        lookup: int | None = None,
        k: int = DEFAULT_K,
        matrix: Path | None = None,
        cold: bool = False,
        save: bool = True,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> DecodingOptions:
        """The settings as given, checked and resolved; SettingError names the first bad one."""
        if model is not None and not model.strip():
            raise SettingError("model", "", "is empty; leave it out for the packaged model, or name one")
        if matrix is not None and matrix.exists() and not matrix.is_file():
            raise SettingError("matrix", matrix, "not a file")
        if k < 1:
            raise SettingError("k", k, "must be at least 1 candidate per matrix row")
        if k > MAX_K:
            raise SettingError("k", k, f"at most {MAX_K} candidates per matrix row (the paper keeps 8)")
        if max_new_tokens < 1:
            raise SettingError("max_new_tokens", max_new_tokens, "must be at least 1")
        drafts = draft_plan(tree, k, lookup)
        sampling = SamplingRequest(temperature, top_p, top_k, repetition_penalty, seed)
        given = sampling.filters_given
        if temperature == 0 and given:
            raise SettingError(
                given[0], getattr(sampling, given[0]), "needs sampling, but temperature 0 is greedy decoding; drop one"
            )
        # `auto` weights follow the model file: its header is read now (cheap), before any load.
        stored_as = resolve_model(model).stored_as if weights == AUTO else None
        from ..models.runtime import Runtime

        runtime = Runtime.resolve(device, dtype, weights, stored_as)
        return cls(model, runtime, drafts, k, matrix, cold, save, sampling, max_new_tokens)  # the fields' order


def draft_plan(tree: str, k: int = DEFAULT_K, lookup: int | None = None) -> DraftPlan:
    """A tree's text form (drafters/plan.py) with the lookup depth over it, checked against k."""
    if lookup is not None and lookup < 0:
        raise SettingError("lookup", lookup, "must be 0 (off) or more")
    if lookup is not None and lookup > MAX_DEPTH:
        raise SettingError("lookup", lookup, f"at most {MAX_DEPTH} tokens deep (default 10)")
    try:
        plan = DraftPlan.parse(tree)
    except InvalidTree as exc:
        raise SettingError("tree", tree, f"{str(exc).removeprefix(f'{tree}: ')}; or auto") from None
    if lookup is not None:
        plan = plan.with_depth("lookup", lookup)
    if plan.tree is not None and plan.tree.max_slot >= k:
        raise SettingError(
            "k",
            k,
            f"tree {plan.tree.name} uses candidate slot {plan.tree.max_slot}; use {plan.tree.max_slot + 1} or more",
        )
    return plan
