"""Update stamps of stored state: microseconds since the epoch, shown as ISO dates."""

from __future__ import annotations

import time
from datetime import datetime, timezone


def now_us() -> int:
    return time.time_ns() // 1000


def iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat(timespec="seconds")
