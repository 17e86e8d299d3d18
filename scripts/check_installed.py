"""Check an installed tr (a wheel in a fresh virtual environment: `make test-wheel`) the way a new
user meets it: its files are inside the package, the shell completions where shells look under the
environment's prefix (share/bash-completion, share/zsh, share/fish), `tr --version` names it, `tr generate` decodes
with the packaged model from a home that has never seen tr, and `tr matrix inspect` shows the
matrix that run saved.

Run it with the installed environment's Python from outside the repository, so that `tr_cli` is
the installed copy and not the source tree:

    cd /tmp && /path/to/venv/bin/python /path/to/scripts/check_installed.py

Exits 1 with the first failed check; prints one line per check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tracked_data_files() -> set[str]:
    """The files besides Python modules that the repository keeps under tr_cli/ (the starter
    matrices, sample prompts, kernel sources): all of them must ship."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "tr_cli"], capture_output=True, text=True, check=True)
    names = {line.removeprefix("tr_cli/") for line in listed.stdout.splitlines()}
    return {name for name in names if not name.endswith(".py")}


class CheckFailed(Exception):
    pass


def completion_files() -> dict[Path, Path]:
    """Each completion script of the repository (completions/, their source) -> where the wheel
    installs it under the environment's prefix (scripts/generate_completions.py's INSTALLED_DIRS)."""
    spec = importlib.util.spec_from_file_location("generate_completions", REPO / "scripts" / "generate_completions.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    prefix = Path(sys.prefix)
    return {
        REPO / generator.completion_path(prog, shell): prefix / generator.INSTALLED_DIRS[shell] / name
        for prog in generator.PROGRAMS
        for shell in generator.SHELLS
        for name in [generator.completion_name(prog, shell)]
    }


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def run(tr: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TR_", "XDG_"))}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1")
    result = subprocess.run([str(tr), *args], env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CheckFailed(f"tr {' '.join(args)} exited {result.returncode}: {tail}")
    return result


def main() -> None:
    import tr_cli

    package = Path(tr_cli.__file__).resolve().parent
    check("site-packages" in package.parts, f"tr_cli imported from {package}, not from an installed package")
    print(f"installed: {package}")
    wanted = tracked_data_files()
    files = [path for path in package.rglob("*") if path.is_file() and path.suffix not in (".py", ".pyc")]
    shipped = {str(path.relative_to(package)) for path in files}
    check(wanted and not wanted - shipped, f"not in the installed package: {', '.join(sorted(wanted - shipped))}")
    extra = shipped - wanted
    check(not extra, f"in the installed package but not in the repository: {', '.join(sorted(extra))}")
    print(f"data files: the {len(wanted)} the repository keeps under tr_cli/, no others")
    completions = completion_files()
    for source, installed in completions.items():
        check(installed.is_file(), f"{installed}: not installed (the wheel's data files: {source.relative_to(REPO)})")
        check(installed.read_bytes() == source.read_bytes(), f"{installed} differs from {source.relative_to(REPO)}")
    print(f"completions: {len(completions)} scripts under {Path(sys.prefix) / 'share'}, as in completions/")

    tr = Path(sys.executable).parent / "tr"
    check(tr.is_file(), f"no tr script beside {sys.executable}")
    with tempfile.TemporaryDirectory(prefix="tr-wheel-home-") as tmp:
        home = Path(tmp)
        version = run(tr, home, "--version").stdout.splitlines()
        check(version[:1] == [f"tr {tr_cli.__version__}"], f"tr --version printed {version[:1]}")
        check(len(version) == 3 and version[2].startswith("CPU: "), f"tr --version: {version}")
        print(f"tr --version: {' | '.join(version)}")

        generated = run(tr, home, "generate", "-n", "8", "-p", "Name three colours.")
        check(generated.stdout.strip() != "", "tr generate printed no text")
        summary = [line for line in generated.stderr.splitlines() if " tokens in " in line]
        # tr's kernels build from the shipped sources on first use; a failed build falls back quietly.
        fallback = [line for line in generated.stderr.splitlines() if "running torch's kernels" in line]
        check(not fallback, f"tr's kernels did not build from the installed sources: {fallback}")
        check(bool(summary) and summary[-1].startswith("8 tokens in "), f"tr generate's summary: {summary}")
        print(f"tr generate: {summary[-1]}")

        report = json.loads(run(tr, home, "matrix", "inspect", "--json").stdout)
        path = Path(report["path"])
        check(home in path.parents, f"matrix inspect shows {path}, not the matrix in the fresh home")
        check(not report["starter"] and report["rows_filled"] > 0, f"matrix inspect: {report}")
        store = report["store"] or {}
        check(store.get("documents", 0) >= 1, f"the recycled store beside it: {store}")
        print(f"tr matrix inspect: {report['rows_filled']:,} rows filled, {store['documents']} conversations stored")


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as failure:
        print(f"check_installed: {failure}", file=sys.stderr)
        sys.exit(1)
