"""`tr` passing its arguments on never loops through shims that run it again (version managers'
`exec .../bin/tr "$@"` scripts, symlinks, chains of them): it still reaches coreutils `tr` byte for
byte, and says so in one line when no usable `tr` is left.

Every run goes through a real `/bin/sh` looking `tr` up on a PATH of real shim scripts, in its own
session with a timeout, so a loop fails the test (and is killed with everything it forked) instead
of hanging it.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
OURS = BIN / "tr"
SYSTEM_TR = Path("/usr/bin/tr")
SYSTEM_DIRS = ["/usr/bin", "/bin"]
TRIED_VAR = "TR_PASSTHROUGH_TRIED"
# Ours runs each shim at most once, but a shim is also run by the shell and by other shims: the chain
# of two shims is shell -> chain1 -> chain2 -> ours -> chain1 -> chain2 -> ours -> chain2 -> ours -> coreutils.
MAX_SHIM_RUNS = 6
# A working chain takes a few Python starts; this only catches loops that no shim sees (see shim()).
LOOP_TIMEOUT = 60

needs_system_tr = pytest.mark.skipif(not os.access(SYSTEM_TR, os.X_OK), reason="no /usr/bin/tr to compare with")

TEXT = b"Hello, World!\n  two  spaces\tand a tab  \n"
BINARY = bytes(range(256)) * 2 + b"\r\n\xff\xfe\x00 end\n"
CASES = {
    "upper": (["a-z", "A-Z"], TEXT),
    "binary delete controls": (["-d", "\\000-\\037"], BINARY),
    "raw non-UTF-8 argument": ([b"\xff\xfe", b"AB"], BINARY),
    "fails: reversed range": (["z-a", "x"], TEXT),
    "fails: invalid option": (["-z"], TEXT),
}


def shim(directory: Path, body: str, log: Path, give_up_after: int = 20) -> Path:
    """A shell-script `tr` in `directory` that notes each run of itself in `log`, then runs `body`.

    After `give_up_after` runs (of all shims sharing `log`) it fails instead: a looping chain then
    ends at once, and shims that do not exec cannot pile up processes until the timeout."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tr"
    path.write_text(
        "#!/bin/sh\n"
        f'n=0; [ -f "{log}" ] && while read -r _; do n=$((n + 1)); done < "{log}"\n'
        f'if [ "$n" -ge {give_up_after} ]; then echo "shim ran $n times: the passthrough loops" >&2; exit 99; fi\n'
        f'echo "$0" >> "{log}"\n'
        f"{body}\n"
    )
    path.chmod(0o755)
    return path


def run_shell(script: str, path_dirs: list, stdin: bytes = b"", args=(), extra_env: dict | None = None):
    """Run `script` in /bin/sh with PATH = path_dirs, as a user's shell would; fail on a loop."""
    env = {k: v for k, v in os.environ.items() if k != TRIED_VAR}
    env.update({"PATH": os.pathsep.join(map(str, path_dirs)), "LC_ALL": "C", **(extra_env or {})})
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script, "sh", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # so a runaway chain, forked shims included, dies with its group
    )
    try:
        stdout, stderr = proc.communicate(stdin, timeout=LOOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"`tr` still running after {LOOP_TIMEOUT}s: the passthrough loops")
    return proc.returncode, stdout, stderr


def shell_tr(path_dirs: list, args, stdin: bytes = b""):
    """`tr ARGS` looked up on PATH = path_dirs by a real shell: (status, stdout, stderr)."""
    return run_shell('exec tr "$@"', path_dirs, stdin, args)


def coreutils(args, stdin: bytes):
    """What coreutils `tr ARGS` does run directly (argv[0] "tr", as every passthrough runs it)."""
    result = subprocess.run(
        ["tr", *args],
        executable=str(SYSTEM_TR),
        input=stdin,
        capture_output=True,
        env={"PATH": os.pathsep.join(SYSTEM_DIRS), "LC_ALL": "C"},
        timeout=60,
    )
    return result.returncode, result.stdout, result.stderr


def runs(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def layouts(tmp: Path, log: Path) -> dict[str, list]:
    """PATH layouts (directories before the system ones) in which shims run our `tr` again."""
    exec_ours = f'exec "{OURS}" "$@"'
    link = tmp / "link"
    link.mkdir()
    (link / "tr").symlink_to(OURS)
    chained_second = shim(tmp / "chain2", exec_ours, log)
    linked_shim = tmp / "linked-shim"
    linked_shim.mkdir()
    (linked_shim / "tr").symlink_to(shim(tmp / "target", exec_ours, log))
    return {
        "exec shim before ours": [shim(tmp / "a", exec_ours, log).parent, BIN],
        "exec shim after ours": [BIN, shim(tmp / "a", exec_ours, log).parent],
        "shim without exec": [shim(tmp / "a", f'"{OURS}" "$@"', log).parent, BIN],
        "shim execing a symlink to ours": [shim(tmp / "a", f'exec "{link / "tr"}" "$@"', log).parent, BIN],
        "chain of two shims": [shim(tmp / "chain1", f'exec "{chained_second}" "$@"', log).parent, tmp / "chain2", BIN],
        "two shims around ours": [shim(tmp / "a", exec_ours, log).parent, BIN, shim(tmp / "b", exec_ours, log).parent],
        "symlinked shim and its target": [linked_shim, tmp / "target", BIN],
        # pyenv/asdf style: put the real bin dir first and look `tr` up again.
        "shim looking tr up on PATH": [shim(tmp / "a", f'PATH="{BIN}:$PATH" exec tr "$@"', log).parent],
        "shim, then ours after ours": [shim(tmp / "a", exec_ours, log).parent, BIN, link],
    }


LAYOUTS = [
    "exec shim before ours",
    "exec shim after ours",
    "shim without exec",
    "shim execing a symlink to ours",
    "chain of two shims",
    "two shims around ours",
    "symlinked shim and its target",
    "shim looking tr up on PATH",
    "shim, then ours after ours",
]


@needs_system_tr
def test_shim_before_ours_reaches_coreutils(tmp_path):
    """The issue: ~/shims/tr is `exec .../bin/tr "$@"`, earlier on PATH than coreutils."""
    log = tmp_path / "log"
    shims = shim(tmp_path / "shims", f'exec "{OURS}" "$@"', log).parent
    assert run_shell("printf abc | tr a-z A-Z", [shims, BIN, *SYSTEM_DIRS]) == (0, b"ABC", b"")
    # Once from the shell, once from ours (it cannot know the shim leads back to it), then skipped.
    assert runs(log) == [str(shims / "tr")] * 2


@needs_system_tr
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_shims_still_reach_coreutils_byte_for_byte(tmp_path, layout, case):
    log = tmp_path / "log"
    dirs = layouts(tmp_path, log)[layout]
    args, stdin = CASES[case]
    assert shell_tr([*dirs, *SYSTEM_DIRS], args, stdin) == coreutils(args, stdin)
    assert len(runs(log)) <= MAX_SHIM_RUNS, runs(log)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_tr_left_after_shims_is_one_line(tmp_path, layout):
    """Without coreutils on PATH: one line naming the shims that ran `tr` again, status 127."""
    log = tmp_path / "log"
    dirs = layouts(tmp_path, log)[layout]
    status, stdout, stderr = shell_tr(dirs, ["a-z", "A-Z"], TEXT)
    assert (status, stdout) == (127, b"")
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, lines
    prefix = "tr: no other `tr` on PATH to pass these arguments to: "
    assert lines[0].startswith(prefix) and " ran this `tr` again" in lines[0] and "see `tr --help`" in lines[0]
    named = lines[0].removeprefix(prefix).split(" ran this `tr` again", 1)[0].split(", ")
    for path in named:  # the real paths of shims, never of our own script
        assert Path(path).is_absolute() and Path(path).name == "tr" and Path(path).resolve() != OURS.resolve()
    assert len(runs(log)) <= MAX_SHIM_RUNS, runs(log)


@needs_system_tr
def test_shim_making_new_shims_forever_is_cut_off(tmp_path):
    """A shim that copies itself to a fresh directory first on PATH each run is a new candidate every
    time; the chain still ends, with the one-line error."""
    log = tmp_path / "log"
    body = (
        f'd=$(/usr/bin/mktemp -d "{tmp_path}/new.XXXXXX") && /bin/cp "$0" "$d/tr" && PATH="$d:$PATH" exec "{OURS}" "$@"'
    )
    shims = shim(tmp_path / "shims", body, log, give_up_after=100).parent
    status, stdout, stderr = shell_tr([shims, BIN, *SYSTEM_DIRS], ["a-z", "A-Z"], TEXT)
    assert (status, stdout) == (127, b"")
    lines = stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tr: no other `tr` on PATH"), lines
    assert 2 <= len(runs(log)) <= 64


@needs_system_tr
def test_candidates_listed_as_tried_are_skipped(tmp_path):
    """A shim named in $TR_PASSTHROUGH_TRIED is not run again; coreutils after it still is."""
    log = tmp_path / "log"
    shims = shim(tmp_path / "shims", f'exec "{OURS}" "$@"', log).parent
    result = run_shell('exec tr "$@"', [BIN, shims, *SYSTEM_DIRS], TEXT, ["a-z", "A-Z"], {TRIED_VAR: str(shims / "tr")})
    assert result == coreutils(["a-z", "A-Z"], TEXT)
    assert runs(log) == []


def test_no_tr_at_all_keeps_the_short_message():
    status, stdout, stderr = shell_tr([BIN], ["a-z", "A-Z"], TEXT)
    assert (status, stdout) == (127, b"")
    assert stderr.decode() == (
        "tr: no other `tr` on PATH to pass these arguments to (this `tr` is Token Recycling: see `tr --help`)\n"
    )
