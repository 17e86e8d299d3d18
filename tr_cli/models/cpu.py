"""The CPU in words and by its instruction sets, read from /proc/cpuinfo (no torch: `tr --version`
says it at once). Its widest set decides our costs: results tables are kept per kind."""

from __future__ import annotations

import platform
from pathlib import Path


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_flags() -> set[str]:
    line = next((line for line in _cpuinfo_lines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_has_native_bf16() -> bool:
    """AMX or AVX-512 BF16: a bf16 forward is then cheaper than float32 on the CPU."""
    flags = cpu_flags()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def cpu_isa() -> str:
    """The CPU's widest instruction set that decides our costs, in the words our results tables
    use: 'AMX', 'AVX512-BF16', 'AVX512', 'AVX2' (or what torch reports where /proc is absent)."""
    flags = cpu_flags()
    for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2")):
        if flag in flags:
            return name
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_name() -> str:
    """The CPU's model name, e.g. 'AMD EPYC'."""
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
