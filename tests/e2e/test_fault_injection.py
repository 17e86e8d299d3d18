"""Fault injection on `tr generate` with the packaged model (issue 15): a signal at a random point
(model load, decoding, the save at exit), SIGKILL in the middle of an atomic write, three
processes saving one matrix at once, and a save on a full disk. Whatever happens, the stored files
are absent or whole (tr's own readers load them), a caught signal keeps what the run learned, the
exit status is the documented one and stderr holds no traceback."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import new_home

from tr_cli.core import TokenRecyclingDecoder
from tr_cli.core.design.acceptance_stats import AcceptanceStats
from tr_cli.engine.calibration import calibration_key, load_or_calibrate
from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.store.acceptance_file import acceptance_path
from tr_cli.store.atomic import STALE_TEMP_SECONDS, atomic_write, temp_files
from tr_cli.store.calibration import read_calibration
from tr_cli.store.matrix_file import MatrixFile, is_matrix_name, read_matrix
from tr_cli.store.paths import seed_dir
from tr_cli.store.recycled_file import RecycledStoreFile, read_recycled_store, recycled_store_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="sees a tr waiting at a lock in /proc/PID/fd"),
]

BIN = Path(sys.executable).parent
K = 8
# The starter matrix shipped with tr: a fresh TR_HOME starts from it, saving to the same name.
SEED = next(path for path in sorted(seed_dir().glob("*.safetensors")) if is_matrix_name(path))
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGKILL: -signal.SIGKILL}
# The last stderr line of a run a caught signal ended (tr_cli/cli/errors.py).
CAUGHT_LINE = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "terminated (SIGTERM)",
    signal.SIGHUP: "terminated (SIGHUP)",
}
SAVED_ROWS = re.compile(r"matrix: ([\d,]+) rows saved to ")
FINISHED = re.compile(r"\d+ tokens in [\d.]+s .* finish: ")
CALIBRATION_CACHE = Path(tempfile.gettempdir()) / "tr-test-cache" / "calibration"
# Replies far longer than the milestones below, so a signal lands mid-decoding.
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works, in detail.",
    "Describe the water cycle step by step.",
    "List ten fruits and say what color each one is.",
]


def default_signals() -> None:
    """In the child before exec: signals a background pytest inherited as ignored (SIGINT under
    `cmd &`, SIGHUP under nohup) are tr's to handle again, as in a terminal."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _drain(stream, sink: bytearray) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        sink.extend(chunk)


class Tr:
    """`tr ARGS` with TR_HOME=home, its stdout and stderr collected as they come (stdin: nothing,
    or the file descriptor given)."""

    started: list[Tr] = []  # killed after each test, so a failing one leaves no tr running

    def __init__(self, home: Path, *args: str, stdin: int = subprocess.DEVNULL, **extra_env: str) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "NO_COLOR": "1",
            "COLUMNS": "200",
            "TR_HOME": str(home),
            **extra_env,
        }
        self.proc = subprocess.Popen(
            [str(BIN / "tr"), *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=default_signals,
        )
        self.stdout, self.stderr = bytearray(), bytearray()
        self._readers = [
            threading.Thread(target=_drain, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=_drain, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        Tr.started.append(self)

    @property
    def out(self) -> str:
        return bytes(self.stdout).decode(errors="replace")

    @property
    def err(self) -> str:
        return bytes(self.stderr).decode(errors="replace")

    def wait_for(self, ready: Callable[[], bool], timeout: float = 600) -> bool:
        """Poll until `ready()`; False when the process ended first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                self.finish()
                return ready()
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"tr never got there in {timeout} s; stderr:\n{self.err}")
            time.sleep(0.01)
        return True

    def finish(self, timeout: float = 600) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"tr still runs after {timeout} s; stderr:\n{self.err}") from None
        for reader in self._readers:
            reader.join()
        return code

    def holds_open(self, path: Path) -> bool:
        """Whether the process has `path` open: it is inside the save, at that file's lock."""
        target = os.path.realpath(path)
        fds = Path(f"/proc/{self.proc.pid}/fd")
        with contextlib.suppress(OSError):
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    if os.readlink(fds / fd) == target:
                        return True
        return False


@pytest.fixture(autouse=True)
def no_tr_left_running() -> Iterator[None]:
    yield
    while Tr.started:
        run = Tr.started.pop()
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(30)


@contextlib.contextmanager
def held(lock: Path) -> Iterator[Callable[[], None]]:
    """Hold a lock file as another `tr` saving would (flock); yields a function releasing it early."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "a")  # noqa: SIM115 - released by the caller or on leaving the block
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)

    def release() -> None:
        if not handle.closed:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    try:
        yield release
    finally:
        release()


def lock_of(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def matrix_path(home: Path) -> Path:
    return home / "data" / "matrices" / SEED.name


def read_acceptance_counts(path: Path) -> AcceptanceStats:
    stats = AcceptanceStats(K)
    stats.load_dict(json.loads(path.read_text()))
    return stats


@dataclass
class Stored:
    """The state files of a TR_HOME as tr's own readers load them (None: no such file)."""

    matrix: MatrixFile | None
    store: RecycledStoreFile | None
    acceptance: AcceptanceStats | None
    temps: list[Path]
    corrupt: list[Path]


def stored(home: Path) -> Stored:
    """Raises (MatrixFileError, StoreFileError, ValueError) for a file that is there but not whole."""
    path = matrix_path(home)
    files = (path, recycled_store_path(path), acceptance_path(path))
    return Stored(
        read_matrix(path) if path.exists() else None,
        read_recycled_store(files[1]) if files[1].exists() else None,
        read_acceptance_counts(files[2]) if files[2].exists() else None,
        [tmp for file in files for tmp in temp_files(file)],
        sorted(path.parent.glob("*.corrupt-*")) if path.parent.exists() else [],
    )


def seeded() -> Stored:
    """What a fresh TR_HOME starts from: the starter files shipped with tr."""
    return Stored(
        read_matrix(SEED),
        read_recycled_store(recycled_store_path(SEED)),
        read_acceptance_counts(acceptance_path(SEED)),
        [],
        [],
    )


@pytest.fixture(scope="module")
def calibration(tmp_path_factory, gguf_cache) -> Path:
    """t(N) of this machine for the default tree, kept between runs in the system's temp dir (as
    conftest keeps SmolLM2's tokenizer): each trial's fresh TR_HOME gets a copy, so the runs under
    test go straight from loading to decoding. Measured here by tr's own calibration code on the
    model `tr generate` loads, keyed as it keys it, whatever the machine's load: tr rightly caches
    no t(N) measured beside a busy process, and these runs only need one to start from."""
    CALIBRATION_CACHE.mkdir(parents=True, exist_ok=True)
    home = new_home(tmp_path_factory.mktemp("calibrate") / "home", gguf_cache)
    (home / "data").mkdir()
    (home / "data" / "calibration").symlink_to(CALIBRATION_CACHE, target_is_directory=True)
    options = DecodingOptions.parse()  # what `tr generate` runs with no flags
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TR_HOME", str(home))
        loaded = Engine.open(options, matrix=False, decoder=False).loaded
        decoder = TokenRecyclingDecoder(
            loaded.model,
            k=options.k,
            cost=lambda decoder: load_or_calibrate(decoder, loaded.model_id, busy_cores=math.inf),
        )
        dtype = next(decoder.model.parameters()).dtype
        key = calibration_key(decoder.model, decoder.device, dtype, decoder.k, decoder.forward_pass.name)
        assert read_calibration(key) is not None, "no calibration cached under the key tr reads"
    # tr itself reads it: a key this process computed differently would have the trials measure again.
    run = Tr(home, "generate", "-n", "1", "--no-save", "-p", "Hi")
    assert run.finish() == 0 and "Measuring step cost" not in run.err, run.err
    return CALIBRATION_CACHE


def fresh_home(path: Path, gguf_cache: Path, calibration: Path) -> Path:
    home = new_home(path, gguf_cache)
    shutil.copytree(calibration, home / "data" / "calibration")
    return home


@dataclass
class Trial:
    number: int
    sig: signal.Signals
    milestone: str  # "load", "decode" or "save"
    prompt: str
    lock: str = ""  # at "save": the file whose lock the exit save waits for
    sent: bool = False  # the signal went to a live process
    decoded: bool = False  # stdout held text when it went (the prefill had learned rows)
    code: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def hit(self) -> bool:
        """The signal cut the run short (rather than arriving once it had finished)."""
        return self.sent and self.code == EXIT[self.sig]

    def row(self) -> str:
        outcome = "ok" if not self.problems else "; ".join(self.problems)
        where = "hit" if self.hit else "missed (run had finished)"
        at = f"save ({self.lock} lock)" if self.lock else self.milestone
        return f"#{self.number} {self.sig.name} at {at}: exit {self.code}, {where}: {outcome}"


def run_trial(home: Path, trial: Trial, rng: random.Random) -> None:
    """Start `tr generate -n 64`, send the trial's signal at its milestone, check what is left."""
    matrix = matrix_path(home)
    files = {"acceptance": acceptance_path(matrix), "matrix": matrix, "store": recycled_store_path(matrix)}
    name = rng.choice(sorted(files))
    lock = lock_of(files[name])
    trial.lock = name if trial.milestone == "save" else ""
    with held(lock) if trial.milestone == "save" else contextlib.nullcontext(lambda: None) as release:
        run = Tr(home, "generate", "-n", "64", "-p", trial.prompt)
        if trial.milestone == "load":
            reached = run.wait_for(lambda: b"Loading " in run.stderr)
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in loading the model
        elif trial.milestone == "decode":
            size = rng.randint(1, 24)
            reached = run.wait_for(lambda: len(run.stdout) >= size)
        else:  # at the exit save, waiting for the lock this test holds as another tr would
            reached = run.wait_for(lambda: run.holds_open(lock))
        if reached and run.proc.poll() is None:
            trial.decoded = len(run.stdout) > 0
            run.proc.send_signal(trial.sig)
            trial.sent = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(5)  # a tr that finishes its save once the lock is free waits for release()
        release()
        trial.code = run.finish()
    check_trial(home, trial, run)


def check_trial(home: Path, trial: Trial, run: Tr) -> None:
    problems, err = trial.problems, run.err
    finished = bool(FINISHED.search(err))
    if trial.code != (EXIT[trial.sig] if trial.sent else 0) and not (trial.code == 0 and finished):
        problems.append(f"exit status {trial.code}, expected {EXIT[trial.sig] if trial.sent else 0}")
    if "Traceback" in err or "Exception ignored" in err:
        problems.append(f"traceback on stderr:\n{err}")
    caught = trial.sig != signal.SIGKILL and trial.hit
    if caught and err.strip().splitlines()[-1:] != [CAUGHT_LINE[trial.sig]]:
        problems.append(f"last stderr line is not {CAUGHT_LINE[trial.sig]!r}: {err.strip().splitlines()[-1:]}")
    try:
        state = stored(home)
    except Exception as exc:  # noqa: BLE001 - a file tr's readers refuse is the failure reported
        problems.append(f"a stored file is not whole: {exc}")
        return
    if state.corrupt:
        problems.append(f"files moved aside as corrupt: {state.corrupt}")
    if state.temps and trial.sig != signal.SIGKILL:
        problems.append(f"temp files left after {trial.sig.name}: {[p.name for p in state.temps]}")
    if not (caught and trial.decoded):
        return
    # A caught signal after the prefill learned rows: they are saved before tr leaves.
    start = seeded()
    saved = SAVED_ROWS.search(err)
    warned = "tr: warning:" in err
    if state.matrix is None:
        problems.append(f"matrix not saved ({'a warning says so' if warned else 'and no warning says so'})")
    elif state.matrix.meta.update_count <= start.matrix.meta.update_count:
        problems.append(f"matrix update count {state.matrix.meta.update_count} did not grow past the start's")
    elif saved and state.matrix.meta.update_count != start.matrix.meta.update_count + int(saved[1].replace(",", "")):
        problems.append(f"matrix update count {state.matrix.meta.update_count} is not the start's + {saved[1]}")
    if state.store is None or len(state.store.documents) != len(start.store.documents) + 1:
        count = None if state.store is None else len(state.store.documents)
        problems.append(f"store holds {count} conversations, expected the starter's {len(start.store.documents)} + 1")
    if state.acceptance is None or state.acceptance.observed_steps < start.acceptance.observed_steps:
        problems.append("acceptance statistics not saved")


def test_signals_at_random_points_leave_whole_files_and_keep_what_was_learned(tmp_path, gguf_cache, calibration):
    """Eight runs of `tr generate -n 64`, each sent SIGINT, SIGTERM, SIGHUP or SIGKILL: each signal
    once while it decodes, two of them while the model loads and two while the exit save waits
    for a lock another process holds. Then a later run in a killed home removes the stale temp
    files a kill leaves and works."""
    rng = random.Random(15)
    elsewhere = ["load", "load", "save", "save"]
    rng.shuffle(elsewhere)
    plan = [(sig, "decode") for sig in EXIT] + list(zip(EXIT, elsewhere, strict=True))
    rng.shuffle(plan)
    trials = [Trial(n, sig, where, rng.choice(PROMPTS)) for n, (sig, where) in enumerate(plan)]
    homes = []
    for trial in trials:
        homes.append(fresh_home(tmp_path / f"trial{trial.number}", gguf_cache, calibration))
        run_trial(homes[-1], trial, rng)
    killed = homes[max(trial.number for trial in trials if trial.sig == signal.SIGKILL)]
    later = later_run_problems(killed)
    table = "\n".join([*(trial.row() for trial in trials), f"later run in a killed home: {'; '.join(later) or 'ok'}"])
    print(table)
    assert not later and not any(trial.problems for trial in trials), table
    # Most signals cut a run short: the milestones are reached while tr is busy.
    assert sum(trial.hit for trial in trials) >= 6, table


def later_run_problems(home: Path) -> list[str]:
    """What a SIGKILL in the middle of a write leaves (its temp file, never renamed), aged past
    STALE_TEMP_SECONDS, is removed by the next run, which works; a temp file of a write running
    now is young and stays."""
    matrix = matrix_path(home)
    matrix.parent.mkdir(parents=True, exist_ok=True)
    files = (matrix, recycled_store_path(matrix), acceptance_path(matrix))
    stale = [file.with_name(f".{file.name}.killed.tmp") for file in files]
    old = time.time() - STALE_TEMP_SECONDS - 60
    for path in [*stale, *stored(home).temps]:
        if not path.exists():
            path.write_bytes(b"half a write")
        os.utime(path, (old, old))
    live = matrix.with_name(f".{matrix.name}.live.tmp")
    live.write_bytes(b"a write in progress")
    start = stored(home).matrix or seeded().matrix
    run = Tr(home, "generate", "-n", "8", "-p", "Say hello.")
    if run.finish() != 0:
        return [f"exit status {run.proc.returncode}: {run.err}"]
    after = stored(home)
    problems = [] if after.temps == [live] else [f"temp files left: {[path.name for path in after.temps]}"]
    if after.matrix is None or after.matrix.meta.update_count <= start.meta.update_count:
        problems.append(f"no rows saved: {run.err}")
    return problems


WRITER = """
import os, sys
from pathlib import Path
from tr_cli.store.atomic import atomic_write
target, size = Path(sys.argv[1]), int(sys.argv[2])
def payload(n):
    head = b"%012d" % n
    return head + bytes([n % 251]) * (size - len(head))
atomic_write(target, payload(0))
print("ready", flush=True)
for line in sys.stdin:  # one line per trial: a child writing payloads from that number on
    child = os.fork()
    if child == 0:
        print(os.getpid(), flush=True)
        n = int(line)
        while True:
            atomic_write(target, payload(n))
            n += 1
    print("exit", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
"""


def payload(n: int, size: int) -> bytes:
    head = b"%012d" % n
    return head + bytes([n % 251]) * (size - len(head))


def test_sigkill_during_atomic_writes_leaves_the_old_or_the_new_file_whole(tmp_path):
    """A process rewriting a 4 MiB file with atomic_write in a loop, SIGKILLed at a random moment,
    16 times: the file is always one write's full content, the one before the kill or one the
    killed process finished; what a kill leaves is at most one temp file, which a later write
    removes once it is stale. (A process forked per trial: one import of tr_cli for all.)"""
    size, rng = 4 << 20, random.Random(15)
    target = tmp_path / "m.safetensors"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline() == "ready\n"
        current, mid_write = 0, 0
        for trial in range(1, 17):
            first = trial * 1_000_000
            temps_before = len(temp_files(target))
            writer.stdin.write(f"{first}\n")
            writer.stdin.flush()
            child = int(writer.stdout.readline())
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(child, signal.SIGKILL)
            assert writer.stdout.readline().split() == ["exit", str(-signal.SIGKILL)]
            content = target.read_bytes()
            n = int(content[:12])
            assert content == payload(n, size), f"trial {trial}: a torn file"
            assert n == current or n >= first, f"trial {trial}: holds write {n}, neither the old nor a new one"
            current = n
            left = len(temp_files(target)) - temps_before
            assert left in (0, 1), f"trial {trial}: {left} temp files from one killed write"
            mid_write += left
    finally:
        writer.kill()
        writer.wait(30)
    print(f"{mid_write} of 16 kills landed inside a write, before its rename")
    # Kills landed inside a write, else this test proves nothing.
    assert mid_write >= 1
    old = time.time() - STALE_TEMP_SECONDS - 60
    for tmp in temp_files(target):
        os.utime(tmp, (old, old))
    atomic_write(target, b"after")
    assert temp_files(target) == [] and target.read_bytes() == b"after"


def test_three_processes_saving_one_matrix_at_once_keep_every_row(tmp_path, gguf_cache):
    """Three `tr generate --cold` with a fixed tree on different prompts into one TR_HOME, their
    exit saves held at the matrix lock until all three wait there: the file ends with every row
    each learned (the rows each learns alone in its own home; --cold and a fixed tree: each starts
    empty whatever the file holds and drafts alike however fast it runs, so alone and together
    they learn the same) and all their acceptance counts."""
    tree = tmp_path / "tree.json"  # small: a step costs about one token's forward on the CPU
    tree.write_text(json.dumps({"paths": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}))
    args = ("generate", "--cold", "--tree", str(tree), "-n", "24")
    # One thread each, alone and together (the same arithmetic, so the same rows): three torch
    # processes of two spinning threads each on two cores take minutes.
    threads = {"OMP_NUM_THREADS": "1"}
    prompts = PROMPTS[:3]
    alone_homes = [new_home(tmp_path / f"alone{i}", gguf_cache) for i in range(3)]
    alone = [Tr(home, *args, "-p", prompt, **threads) for home, prompt in zip(alone_homes, prompts, strict=True)]
    for run in alone:
        assert run.finish() == 0, run.err
    references = [stored(home) for home in alone_homes]

    shared = new_home(tmp_path / "shared", gguf_cache)
    lock = lock_of(matrix_path(shared))
    with held(lock) as release:
        runs = [Tr(shared, *args, "-p", prompt, **threads) for prompt in prompts]
        first_wait, deadline = None, time.monotonic() + 600
        while True:
            waiting = [run.holds_open(lock) for run in runs]
            if all(w or run.proc.poll() is not None for w, run in zip(waiting, runs, strict=True)):
                break
            if any(waiting) and first_wait is None:
                first_wait = time.monotonic()
            # Well inside tr's 30 s lock wait: a slow third must not cost the first its save.
            if first_wait is not None and time.monotonic() - first_wait > 20:
                break
            assert time.monotonic() < deadline, [run.err for run in runs]
            time.sleep(0.02)
        print(f"{sum(waiting)} of 3 saves waiting at the matrix lock when it was released")
        release()
        for run in runs:
            assert run.finish() == 0, run.err
    for run, reference in zip(runs, references, strict=True):
        said = SAVED_ROWS.search(run.err)
        assert said and int(said[1].replace(",", "")) == reference.matrix.meta.update_count, run.err

    final = stored(shared)
    assert final.temps == [] and final.corrupt == []
    matrices = [reference.matrix for reference in references]
    learned = [m.stamps > 0 for m in matrices]  # an empty start: the rows a run changed carry stamps
    union = torch.stack(learned).any(dim=0)
    assert final.matrix.meta.update_count == sum(m.meta.update_count for m in matrices)
    assert torch.equal(final.matrix.stamps > 0, union)
    # Each learned row holds what a run that learned it wrote (the last saver's, where several did).
    kept = torch.zeros_like(union)
    for m, rows in zip(matrices, learned, strict=True):
        kept |= rows & (final.matrix.matrix == m.matrix).all(dim=1)
    assert torch.equal(kept, union), f"{int((union & ~kept).sum())} learned rows lost"
    only = [rows & (torch.stack(learned).sum(dim=0) == 1) for rows in learned]
    for m, rows in zip(matrices, only, strict=True):
        assert torch.equal(final.matrix.matrix[rows], m.matrix[rows])
    # Acceptance counts add up across the three (each started from none: --cold).
    assert torch.equal(final.acceptance.trials, sum(r.acceptance.trials for r in references))
    assert torch.equal(final.acceptance.hits, sum(r.acceptance.hits for r in references))


def _pages(size: int) -> int:
    return -(-size // 4096) * 4096


def test_a_save_on_a_full_disk_is_one_warning_and_keeps_the_old_matrix(tmp_path, gguf_cache, calibration):
    """TR_HOME's data dir on a tmpfs with room for a hot matrix and its files plus 1 MiB, less
    than a second copy of the matrix: the matrix save fails with ENOSPC. The reply is printed, the
    failure is one warning line, the exit status is 0 (a failed save is a warning, never fatal),
    the old matrix is untouched and no temp file is left; the store, which fits, is saved."""
    home = new_home(tmp_path / "home", gguf_cache)
    data = home / "data"
    data.mkdir()
    originals = [SEED, recycled_store_path(SEED), acceptance_path(SEED), *calibration.glob("*.json")]
    room = 1 << 20
    assert SEED.stat().st_size > room + (256 << 10)  # the matrix's temp file cannot fit
    size = sum(_pages(path.stat().st_size) for path in originals) + room
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the full disk needs a small tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(data)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the full disk (needs root): {mounted.stderr.strip()}")
    try:
        matrix = matrix_path(home)
        matrix.parent.mkdir()
        (data / "calibration").mkdir()
        for source in originals[:3]:
            shutil.copyfile(source, matrix.parent / source.name)
        for source in originals[3:]:
            shutil.copyfile(source, data / "calibration" / source.name)
        before = matrix.read_bytes()
        documents = len(read_recycled_store(recycled_store_path(matrix)).documents)

        run = Tr(home, "generate", "-n", "16", "-p", PROMPTS[0])
        assert run.finish() == 0, run.err
        assert run.out.strip(), run.err
        warnings = [line for line in run.err.splitlines() if line.startswith("tr: warning:")]
        assert len(warnings) == 1, run.err
        assert f"matrix to {matrix}" in warnings[0] and "No space left on device" in warnings[0], warnings[0]
        assert FINISHED.search(run.err) and not SAVED_ROWS.search(run.err), run.err
        assert "Traceback" not in run.err
        assert matrix.read_bytes() == before
        after = stored(home)
        assert after.temps == [] and after.corrupt == []
        assert len(after.store.documents) == documents + 1  # one part failing costs the others nothing
    finally:
        if subprocess.run(["umount", str(data)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(data)], capture_output=True)
