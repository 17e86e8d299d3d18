"""The `tr` console script: Token Recycling when called with our arguments, coreutils `tr` otherwise.

Installing a command named `tr` shadows coreutils `tr` for everything run with the environment
active (`tr a-z A-Z`, `tr -d '\\n'` in scripts). So `tr` looks at its first argument before
importing anything heavy: one of our subcommands or global options (or no argument at all) runs
the Typer app; anything else replaces this process with the next `tr` on PATH that is not ours,
with the same arguments, environment, stdin, stdout and stderr, so output and exit status are
exactly coreutils'. `token-recycling` (tr_cli.cli:main) never passes through.

A `tr` found on PATH may run this one again (a version manager's shim, `exec .../bin/tr "$@"`),
and it would find that shim first again, forever. So the real paths of the candidates already run
in this chain travel in $TR_PASSTHROUGH_TRIED (os.pathsep-separated) and are skipped: every
candidate runs at most once, and the chain ends at coreutils or at a one-line error. Coreutils
inherits the variable too; it reads no such thing.

This module must stay light (standard library only): `tr a-z A-Z` should cost one Python start,
not a torch import.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Collection

from .cli_names import COMMANDS, GLOBAL_OPTIONS

# Python ignores these at start-up and an ignored disposition survives exec: coreutils `tr`
# writing into a closed pipe must die of SIGPIPE as it does when run directly, not print
# "write error: Broken pipe" and exit 1.
_RESET_SIGNALS = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
# How many bytes of a candidate `tr` are read to recognise a console script of this package.
_SNIFF_BYTES = 2048
# Real paths of the candidates this chain of `tr`s has already exec'd (see the module docstring).
TRIED_VAR = "TR_PASSTHROUGH_TRIED"
# Each hop adds a distinct candidate, so PATH bounds the chain; this bounds it even when shims
# keep changing PATH (or a real path holds os.pathsep and so is never recognised).
_MAX_HOPS = 32
_HELP_HINT = "(this `tr` is Token Recycling: see `tr --help`)"


def is_ours(args: list[str]) -> bool:
    """Whether `tr ARGS` is a Token Recycling invocation (else it belongs to coreutils `tr`)."""
    if not args:
        return True  # our help; coreutils `tr` without operands is only an error
    first = args[0]
    if first in COMMANDS:
        return True
    if first.startswith("--"):
        first = first.split("=", 1)[0]  # --install-completion=bash
    return first in GLOBAL_OPTIONS


def _own_script_paths() -> tuple[set[str], set[str]]:
    """(real paths of this script, real paths of the directories holding it)."""
    files: set[str] = set()
    dirs: set[str] = set()
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and os.sep in script:
        files.add(os.path.realpath(script))
        dirs.add(os.path.realpath(os.path.dirname(os.path.abspath(script))))
    return files, dirs


def _is_tr_cli_script(path: str) -> bool:
    """A console script of this package (another install, a pipx venv): never pass to it."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except OSError:
        return False
    return head.startswith(b"#!") and b"tr_cli" in head


def tried_candidates() -> list[str]:
    """Real paths of the `tr`s this chain already passed to, in order (from $TR_PASSTHROUGH_TRIED)."""
    return [path for path in os.environ.get(TRIED_VAR, "").split(os.pathsep) if path]


def find_next_tr(path_env: str | None = None, skip: Collection[str] = ()) -> str | None:
    """The first executable `tr` on PATH that is not this package's (coreutils, busybox, BSD) and
    whose real path is not in `skip`."""
    own_files, own_dirs = _own_script_paths()
    seen: set[str] = set(skip)
    entries = os.get_exec_path() if path_env is None else path_env.split(os.pathsep)
    for entry in entries:
        candidate = os.path.join(entry or os.curdir, "tr")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        real = os.path.realpath(candidate)
        if real in seen or real in own_files:
            continue
        seen.add(real)
        if os.path.realpath(entry or os.curdir) in own_dirs or _is_tr_cli_script(candidate):
            continue
        return candidate
    return None


def _original_environment() -> dict[bytes, bytes] | dict[str, str]:
    """The environment this process was started with.

    Python may have changed its own: in the C locale it sets LC_CTYPE=C.UTF-8 (PEP 538), which
    would switch coreutils' messages to Unicode quotes. Linux keeps the environment as it was
    passed to exec in /proc/self/environ; elsewhere os.environ is the best there is.
    """
    try:
        with open("/proc/self/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return dict(os.environ)
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def _with_tried(env: dict, tried: list[str]) -> dict:
    """`env` with $TR_PASSTHROUGH_TRIED set to `tried`, keyed as `env` is (bytes from /proc or str)."""
    value = os.pathsep.join(tried)
    if env and isinstance(next(iter(env)), bytes):
        env[os.fsencode(TRIED_VAR)] = os.fsencode(value)
    else:
        env[TRIED_VAR] = value
    return env


def _no_tr_left(tried: list[str]) -> str:
    """The one line saying why there is no `tr` left to pass these arguments to."""
    if not tried:
        return f"tr: no other `tr` on PATH to pass these arguments to {_HELP_HINT}"
    named = ", ".join(tried[:3]) + (f" and {len(tried) - 3} more" if len(tried) > 3 else "")
    return (
        f"tr: no other `tr` on PATH to pass these arguments to: {named} ran this `tr` again"
        f" (skipped as listed in ${TRIED_VAR}); put a `tr` that is not a shim for this one on PATH {_HELP_HINT}"
    )


def pass_through(args: list[str]) -> None:
    """Replace this process with the next `tr` on PATH; return only if there is none."""
    tried = tried_candidates()
    target = find_next_tr(skip=tried) if len(tried) < _MAX_HOPS else None
    if target is None:
        sys.stderr.write(_no_tr_left(tried) + "\n")
        sys.exit(127)
    for name in _RESET_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_DFL)
    try:
        env = _with_tried(_original_environment(), [*tried, os.path.realpath(target)])
        os.execve(target, ["tr", *args], env)
    except OSError as exc:
        sys.stderr.write(f"tr: cannot run {target}: {exc.strerror}\n")
        sys.exit(126)


def main() -> None:
    args = sys.argv[1:]
    if not is_ours(args):  # a shell asking for completions runs `tr` without arguments: ours
        pass_through(args)
    from .cli import main as app_main

    app_main()
