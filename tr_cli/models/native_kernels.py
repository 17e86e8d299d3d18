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
`load` compiles once per source, torch version, compiler and flags into the cache dir (the sources
side by side, about 40 s on 2 cores, said through `status` with its progress; `python -m
tr_cli.cli.build_kernels`, which `make install` runs, does it ahead), checks the library against
the checksum its build wrote (a damaged one is built again: loading it would crash the process),
and loads it into `torch.ops.tr_kernels`.
"""

from __future__ import annotations

import contextlib
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
        "gguf_repack.cpp",
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
# Written after a build: the library's size and SHA-256, checked before every load (a library cut
# short or overwritten would crash dlopen with a bus error or a segfault, not fail it).
_CHECKSUM = "tr_kernels.so.sha256"
_ESTIMATE = "40 s"  # 71 s of compiler CPU time, in parallel on 2 cores (a start says so before building)
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

    library = build_folder(directory) / _LIBRARY
    if not _whole(library):  # missing, or damaged since its build (truncated, overwritten): built again
        status(f"Building tr's int4/int8 kernels for this CPU (once per machine, about {_ESTIMATE})")
        _build(library, status)
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        raise KernelBuildError(
            f"tr's kernels at {library} do not load ({exc}); delete that folder to rebuild them"
        ) from None
    _loaded = library
    return library


def build_folder(directory: Path) -> Path:
    """Where in `directory` the build of this source, torch, compiler and flags lives (its library
    and checksum); a folder copied from another cache under the same name is that very build."""
    import torch

    return directory / _build_key(torch.__version__)


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


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _whole(library: Path) -> bool:
    """Whether the library is there as its build wrote it (size and SHA-256 in its checksum file)."""
    try:
        size, digest = (library.parent / _CHECKSUM).read_text().split()
        return library.stat().st_size == int(size) and _digest(library) == digest
    except (OSError, ValueError):
        return False


def _run_all(commands: list[list[str]], library: Path, status: Status, cxx: str | None) -> None:
    """Run the compile commands side by side (one per core), saying how many are done."""
    pending, running, done = list(commands), [], 0
    width = max(1, os.cpu_count() or 1)
    try:
        while pending or running:
            while pending and len(running) < width:
                command = pending.pop(0)
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                running.append((command, process))
            command, process = running.pop(0)
            out, err = process.communicate(timeout=900)
            if process.returncode != 0:
                _failed(command, out, err, process.returncode, library, cxx)
            done += 1
            status(f"Building tr's int4/int8 kernels for this CPU: {done} of {len(commands)} sources compiled")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"building tr's kernels with {cxx} failed: {exc}") from None
    finally:
        for _, process in running:
            process.kill()
            process.wait()


def _failed(command: list[str], out: str, err: str, code: int, library: Path, cxx: str | None) -> None:
    log = library.parent / "build.log"
    try:
        log.write_text(" ".join(command) + "\n\n" + out + err)
        where = f"the whole log: {log}"
    except OSError as exc:  # a full disk, say: the compiler's words are still shown
        where = f"no log written: {exc.strerror}"
        with contextlib.suppress(OSError):  # a log cut short by the full disk would read as the whole story
            log.unlink()
    said = err.splitlines()
    lines = [line for line in said if "error" in line.lower()] or said
    first = lines[0].strip() if lines else f"exit status {code}"
    raise KernelBuildError(f"building tr's kernels with {cxx} failed: {first} ({where})")


def _build(library: Path, status: Status = quiet) -> None:
    """Compile (the sources in parallel) and link into a temporary folder beside `library`, then
    move the library in place and write its checksum: a build cut short leaves nothing a later
    start would load."""
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
        _run_all(compile_steps, library, status, cxx)
        link = [cxx, "-shared", *map(str, objects), "-o", str(out), *libraries, *rpaths, "-lc10", "-ltorch_cpu"]
        _run_all([[*link, "-ltorch"]], library, quiet, cxx)
        try:
            (library.parent / _CHECKSUM).unlink(missing_ok=True)
            os.replace(out, library)
            checksum = Path(scratch) / _CHECKSUM
            checksum.write_text(f"{library.stat().st_size} {_digest(library)}\n")
            os.replace(checksum, library.parent / _CHECKSUM)
        except OSError as exc:
            raise KernelBuildError(
                f"cannot write tr's kernels to {library.parent} ({exc.strerror}); "
                "free some space or point TR_HOME elsewhere"
            ) from None
