"""What one verification step costs as a function of its size, measured on this device.

t(N) is the time of a forward over N new tokens (plus the top-k that verification needs) on a
short KV cache. It is nearly flat while the model is bound by reading its weights and grows once
compute dominates; where it bends depends on the device, the model and the dtype, which is why
the tree is sized from a measurement instead of a fixed spec.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

CALIBRATION_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128)
_TABLE_SIZES = 512  # t(n) looked up, not interpolated, up to here


@dataclass(frozen=True)
class CostModel:
    """Measured step times (seconds) at increasing sizes; linear between and beyond them."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.seconds):
            raise ValueError("cost model: needs at least two (size, seconds) points")
        if list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ValueError("cost model: sizes must be distinct, increasing and positive")
        if any(not s > 0 for s in self.seconds):
            raise ValueError("cost model: times must be positive")
        # Planners ask for t(n) dozens of times a step: sizes up to the last measured one are a lookup.
        table = [self._interpolated(n) for n in range(min(self.sizes[-1], _TABLE_SIZES) + 1)]
        object.__setattr__(self, "_table", table)

    def time(self, n: int) -> float:
        """Estimated seconds for a step over n tokens (root + draft nodes)."""
        table = self._table
        return table[n] if 0 <= n < len(table) else self._interpolated(n)

    def _interpolated(self, n: int) -> float:
        xs, ys = self.sizes, self.seconds
        if n <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                break
        # Past the last point, extend the last segment (never cheaper than the last point).
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), ys[0])

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        try:
            return cls(tuple(int(x) for x in data["sizes"]), tuple(float(x) for x in data["seconds"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"cost model: expected {{'sizes': [...], 'seconds': [...]}} ({exc})") from exc


# A probe stops at the first size whose step costs this many one-token steps: a tree that large pays
# only where a step accepts more tokens than that, and from there a CPU's curve is a straight line
# (compute-bound rows) that CostModel extends from the last two sizes timed. On the 0.5B Qwen2 on a
# 2-core EPYC this times sizes up to 48 of 128: t(N) in ~5 s instead of ~13 s at the first start.
STEEPEST = 12.0


def calibrate(
    run_step: Callable[[int], None],
    sizes: tuple[int, ...] = CALIBRATION_SIZES,
    repeats: int = 3,
    warmup: int = 2,
    steepest: float = STEEPEST,
) -> CostModel:
    """Time `run_step(n)` (one forward over n tokens, synchronized) for each size. Each larger size
    is timed right after a step of the smallest, and its price is the median over the repeats of
    that pair's ratio, times the fastest smallest step. Trees are chosen by these ratios (tokens per
    second is expected tokens over t), and a pause of the machine (another process, a frequency
    step) slows both steps of a pair alike, where a fastest-of-repeats per size mixed quiet and
    slow moments: two fresh homes once measured t(8) = 53 and 71 ms for one 1.5B model. Sizes go
    round-robin; the curve is then made non-decreasing (noise, not physics). A first, untimed pass
    up the sizes warms each and ends at the first as dear as `steepest` one-token steps (in two pairs
    in a row): larger sizes are not timed (CostModel extends the curve past the last one).
    """
    for _ in range(warmup):
        run_step(sizes[0])

    def timed(n: int) -> float:
        start = time.perf_counter()
        run_step(n)
        return time.perf_counter() - start

    def steep(n: int) -> bool:
        base = timed(sizes[0])
        return timed(n) >= steepest * base

    kept = [sizes[0]]
    for n in sizes[1:]:
        kept.append(n)
        if steep(n) and steep(n):  # twice: one pause of the machine during a step is no cut
            break
    sizes = tuple(kept)
    smallest: list[float] = []
    ratios: dict[int, list[float]] = {n: [] for n in sizes[1:]}
    for _ in range(repeats):
        for n in sizes[1:]:
            base = timed(sizes[0])
            smallest.append(base)
            ratios[n].append(timed(n) / base)
    seconds = [min(smallest)]
    for n in sizes[1:]:
        seconds.append(max(seconds[0] * statistics.median(ratios[n]), seconds[-1]))
    return CostModel(tuple(sizes), tuple(seconds))
