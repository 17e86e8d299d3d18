"""How much CPU the rest of the machine used while this process did something: a t(N) measured
while another heavy process shares the cores is several times too high (OpenMP threads spinning
against each other), and cached, it would mis-size every tree of later, quiet runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

_PROC_STAT = Path("/proc/stat")
# Fields of /proc/stat's "cpu" line that count busy time: user, nice, system, irq, softirq, steal
# (guest time is already inside user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def _machine_busy_seconds() -> float | None:
    """CPU seconds all processes have used since boot; None where /proc/stat is not there."""
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
        ticks = sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    except (OSError, ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


class OtherLoad:
    """`with OtherLoad() as load: ...` then `load.cores`: the average number of cores other
    processes kept busy during the block (None when the platform does not say)."""

    def __enter__(self) -> OtherLoad:
        self.cores: float | None = None
        self._start = (time.monotonic(), _machine_busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _machine_busy_seconds()
        wall = time.monotonic() - wall0
        if busy0 is None or busy1 is None or wall <= 0:
            return
        others = (busy1 - busy0) - (_own_seconds() - own0)
        self.cores = max(0.0, others / wall)
