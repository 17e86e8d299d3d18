"""tr's own kernels, compiled for this machine on first use: int4/int8 matmuls (quantized_matmul.cpp),
the row-exact attention that goes with them (row_attention.cpp, row_attention.py), a Llama-family
layer's parts built on both (fused_layers.cpp, fused_layers.py), verification's per-row top-k
(row_topk.cpp) and the KV cache's compaction after a step (cache_rows.cpp).

torch's weight-only CPU kernels take bfloat16 activations and cost about one extra token per row
on AVX2 CPUs, so a draft tree costs what decoding its tokens one by one costs. tr's kernels
compute from float32 activations quantized per row to int8 (as llama.cpp does), with integer dot
products whose rows share each unpacked weight group (benchmarks/matmul_kernels.py measures both).

They need an x86-64 CPU with AVX2, FMA and F16C (AVX512-VNNI's dot products are used where present)
and a C++ compiler at run time (the package ships the source, not a binary built for someone
else's CPU). `unavailable()` says cheaply, before anything loads, why they cannot run here;
`load` compiles once per source, torch version, compiler and flags into the cache dir (about 20 s,
said through `status`) and loads the library into `torch.ops.tr_kernels`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import ModelError
from .cpu import cpu_flags
from .progress import Status, quiet

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "quantized_matmul.cpp",
        "row_attention.cpp",
        "fused_layers.cpp",
        "fused_step.cpp",
        "row_topk.cpp",
        "cache_rows.cpp",
    )
)
HEADERS = (Path(__file__).with_name("tr_kernels.h"),)
NEEDED_FLAGS = ("avx2", "fma", "f16c")
# OpenMP for at::parallel_for (torch's thread pool); the library links to no OpenMP runtime of its
# own: its GOMP symbols resolve to the one torch already loaded, so both share one pool of threads.
_COMPILE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-w")
# Where the CPU has them, AVX512-VNNI's integer dot products (quantized_matmul.cpp; the same bits).
VNNI_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
_VNNI_COMPILE_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
# And where it also has AMX's int8 tiles, a step's rows through them (the same bits again).
AMX_FLAGS = (*VNNI_FLAGS, "amx_tile", "amx_int8")
_AMX_COMPILE_FLAGS = ("-mamx-tile", "-mamx-int8")
_LIBRARY = "tr_kernels.so"
# TR_KERNELS=torch: torch's kernels; TR_KERNELS=avx2: tr's without AVX-512, =vnni: without AMX
# (comparisons, or a way around a bad build).
_OFF = "TR_KERNELS"

_loaded: Path | None = None


class KernelBuildError(ModelError):
    """tr's kernels could not be compiled or loaded here; the message says why and where the log is."""


def compiler() -> str | None:
    """The C++ compiler: $CXX, else c++ (as setuptools and torch pick one), if it exists."""
    name = os.environ.get("CXX") or "c++"
    return shutil.which(name)


def unavailable() -> str | None:
    """Why tr's kernels cannot run here, in a few words, or None when they can (the build itself
    may still fail: `load` says so)."""
    if os.environ.get(_OFF) == "torch":
        return f"{_OFF}=torch"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"they are written for x86-64 CPUs, this is {platform.machine()}"
    missing = [flag.upper() for flag in NEEDED_FLAGS if flag not in cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if compiler() is None:
        return "no C++ compiler found (install g++ or clang, or set CXX)"
    return None


def instruction_set() -> str:
    """What the kernels are built with here: 'AMX' (AMX int8 tiles and AVX512-VNNI), 'AVX512-VNNI'
    or 'AVX2', the widest the CPU has unless TR_KERNELS=vnni or =avx2 asks for less."""
    flags, asked = cpu_flags(), os.environ.get(_OFF)
    if asked not in ("avx2", "vnni") and all(flag in flags for flag in AMX_FLAGS):
        return "AMX"
    if asked != "avx2" and all(flag in flags for flag in VNNI_FLAGS):
        return "AVX512-VNNI"
    return "AVX2"


def compile_flags() -> tuple[str, ...]:
    extra = {
        "AMX": _VNNI_COMPILE_FLAGS + _AMX_COMPILE_FLAGS,
        "AVX512-VNNI": _VNNI_COMPILE_FLAGS,
    }.get(instruction_set(), ())
    return _COMPILE_FLAGS + extra


def loaded() -> bool:
    return _loaded is not None


def build_id() -> str | None:
    """The loaded build's key (its source, torch, compiler and flags), or None when none is loaded."""
    return None if _loaded is None else _loaded.parent.name


def load(directory: Path, status: Status = quiet) -> Path:
    """Compile the kernels into `directory` unless a build of this very source, torch and compiler
    is there, and load them (once per process). Returns the library's path; KernelBuildError when
    they cannot run or build here."""
    global _loaded
    if _loaded is not None:
        return _loaded
    reason = unavailable()
    if reason is not None:
        raise KernelBuildError(f"tr's int4/int8 kernels cannot run here: {reason}")
    import torch

    library = directory / _build_key(torch.__version__) / _LIBRARY
    if not library.is_file():
        status("Building tr's int4/int8 kernels for this CPU (once, about 20 s)")
        _build(library)
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        raise KernelBuildError(
            f"tr's kernels at {library} do not load ({exc}); delete that folder to rebuild them"
        ) from None
    _loaded = library
    return library


def row_topk(logits, k: int):
    """The k largest of each row of float32 `logits` (rows, V) and their indices, best first, equal
    values by smaller index (row_topk.cpp): core/verify.py's RowTopK, on the loaded kernels."""
    import torch

    return torch.ops.tr_kernels.row_topk(logits, k)


def keep_rows(buffers: list, start: int, rows) -> None:
    """Move each buffer's rows `rows` (ascending absolute positions) to start, start+1, ... in place,
    every layer's keys and values in one call (cache_rows.cpp): core/kv_cache.py's RowKeeper."""
    import torch

    torch.ops.tr_kernels.keep_rows(buffers, start, rows)


def _build_key(torch_version: str) -> str:
    """The build's folder name: what the library depends on (source, torch, compiler, flags)."""
    digest = hashlib.sha256()
    sources = tuple(source.read_bytes() for source in (*SOURCES, *HEADERS))
    parts = (*sources, torch_version.encode(), str(compiler()).encode(), " ".join(compile_flags()).encode())
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _build(library: Path) -> None:
    """Compile and link into a temporary folder beside `library`, then move the library in place:
    a build cut short leaves nothing a later start would load."""
    import torch
    from torch.utils import cpp_extension

    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        scratch_dir = tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-")
    except OSError as exc:
        raise KernelBuildError(
            f"cannot write tr's kernels to {library.parent} ({exc.strerror}); "
            "make it writable or point TR_HOME elsewhere"
        ) from None
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    libraries = [f"-L{path}" for path in cpp_extension.library_paths()]
    rpaths = [f"-Wl,-rpath,{path}" for path in cpp_extension.library_paths()]
    cxx = compiler()
    with scratch_dir as scratch:
        objects = [Path(scratch) / f"{source.stem}.o" for source in SOURCES]
        out = Path(scratch) / _LIBRARY
        compile_steps = [
            [cxx, *compile_flags(), abi, *includes, "-c", str(source), "-o", str(obj)]
            for source, obj in zip(SOURCES, objects, strict=True)
        ]
        link = [cxx, "-shared", *map(str, objects), "-o", str(out), *libraries, *rpaths, "-lc10", "-ltorch_cpu"]
        steps = [*compile_steps, [*link, "-ltorch"]]
        for command in steps:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise KernelBuildError(f"building tr's kernels with {cxx} failed: {exc}") from None
            if done.returncode != 0:
                log = library.parent / "build.log"
                log.write_text(" ".join(command) + "\n\n" + done.stdout + done.stderr)
                said = done.stderr.splitlines()
                lines = [line for line in said if "error" in line.lower()] or said
                first = lines[0].strip() if lines else f"exit status {done.returncode}"
                raise KernelBuildError(f"building tr's kernels with {cxx} failed: {first} (the whole log: {log})")
        os.replace(out, library)
