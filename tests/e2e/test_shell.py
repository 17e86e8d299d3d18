"""Shell integration: `tr` with arguments that are not ours is coreutils `tr`, byte for byte; our
commands stay ours; completion scripts are fresh and completion works through Typer's env var."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tr_cli import __version__
from tr_cli.cli.completion import cached_hub_models, complete_matrix, complete_model, hf_hub_cache, stored_matrices
from tr_cli.entry import is_ours

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OURS = BIN / "tr"
SYSTEM_TR = Path("/usr/bin/tr")
PATH = os.pathsep.join([str(BIN), "/usr/bin", "/bin"])
ENV = {**os.environ, "PATH": PATH, "NO_COLOR": "1", "COLUMNS": "200"}

needs_system_tr = pytest.mark.skipif(not os.access(SYSTEM_TR, os.X_OK), reason="no /usr/bin/tr to compare with")

TEXT = b"Hello, World!\n  two  spaces\tand a tab  \nline three\n\n"
BINARY = bytes(range(256)) * 3 + b"\r\n\xff\xfe\x00 end\n"


def run_tr(executable: Path, args, stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `tr ARGS` (argv[0] "tr", as a shell does) with `executable` as the program."""
    return subprocess.run(
        ["tr", *args],
        executable=str(executable),
        input=stdin,
        capture_output=True,
        env=ENV if env is None else env,
        timeout=120,
    )


def outcome(result: subprocess.CompletedProcess) -> tuple[int, bytes, bytes]:
    return result.returncode, result.stdout, result.stderr


PASSTHROUGH_CASES = {
    "upper": (["a-z", "A-Z"], TEXT),
    "delete newlines": (["-d", "\\n"], TEXT),
    "squeeze spaces": (["-s", " "], TEXT),
    "complement": (["-c", "a-zA-Z\\n", "_"], TEXT),
    "classes": (["[:lower:]", "[:upper:]"], TEXT),
    "binary delete controls": (["-d", "\\000-\\037"], BINARY),
    "binary keep printable": (["-cd", "[:print:]"], BINARY),
    "binary high bytes": (["\\200-\\377", "x"], BINARY),
    "raw non-UTF-8 argument": ([b"\xff\xfe", b"AB"], BINARY),
    "escape hatch for our names": (["--", "generate", "GENERATE"], b"generate a reply\n"),
    "fails: invalid option": (["-z"], TEXT),
    "fails: missing operand": (["a"], TEXT),
    "fails: reversed range": (["z-a", "x"], TEXT),
}


@needs_system_tr
@pytest.mark.parametrize("case", list(PASSTHROUGH_CASES))
def test_passthrough_is_coreutils_byte_for_byte(case):
    args, stdin = PASSTHROUGH_CASES[case]
    ours, theirs = run_tr(OURS, args, stdin), run_tr(SYSTEM_TR, args, stdin)
    assert outcome(ours) == outcome(theirs)
    if case.startswith("fails"):
        assert theirs.returncode != 0 and theirs.stderr


@needs_system_tr
@pytest.mark.parametrize("locale", [None, "C.UTF-8"])
def test_passthrough_keeps_the_environment(locale):
    """Python coerces the C locale to C.UTF-8 in its own environment; coreutils must not see it
    (its messages would switch to Unicode quotes)."""
    env = {"PATH": PATH} if locale is None else {"PATH": PATH, "LC_ALL": locale}
    for args in (["a"], ["-x"], ["a-z", "A-Z"]):
        assert outcome(run_tr(OURS, args, TEXT, env)) == outcome(run_tr(SYSTEM_TR, args, TEXT, env))


@needs_system_tr
def test_passthrough_dies_of_sigpipe_like_coreutils():
    """Python ignores SIGPIPE; exec keeps an ignored signal ignored unless we reset it."""
    script = 'head -c 20000000 /dev/zero | "$0" "\\000" a | head -c 1 >/dev/null; echo "${PIPESTATUS[1]}"'
    results = [
        subprocess.run(["bash", "-c", script, str(tr)], capture_output=True, text=True, env=ENV, timeout=120)
        for tr in (OURS, SYSTEM_TR)
    ]
    assert results[0].stdout == results[1].stdout == "141\n"
    assert results[0].stderr == results[1].stderr == ""


@needs_system_tr
def test_passthrough_imports_nothing_heavy():
    result = run_tr(OURS, ["a-z", "A-Z"], b"quick\n", {**ENV, "PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0 and result.stdout == b"QUICK\n"
    modules = [
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.decode().splitlines()
        if line.startswith("import time:")
    ]
    assert "tr_cli.entry" in modules
    heavy = [
        m
        for m in modules
        if m.split(".")[0] in {"torch", "transformers", "typer", "click", "rich", "huggingface_hub"}
        or m == "tr_cli.cli"
        or m.startswith("tr_cli.cli.")
    ]
    assert not heavy


@needs_system_tr
def test_passthrough_skips_other_installs_of_ours(tmp_path):
    """A copy of our script (another venv, pipx) or a link to it earlier on PATH is never run."""
    copy_dir, link_dir = tmp_path / "copy", tmp_path / "link"
    copy_dir.mkdir()
    link_dir.mkdir()
    (copy_dir / "tr").write_bytes(OURS.read_bytes())
    (copy_dir / "tr").chmod(0o755)
    (link_dir / "tr").symlink_to(OURS)
    env = {**ENV, "PATH": os.pathsep.join([str(copy_dir), str(link_dir), PATH])}
    for executable in (copy_dir / "tr", link_dir / "tr", OURS):
        assert outcome(run_tr(executable, ["a-z", "A-Z"], TEXT, env)) == outcome(
            run_tr(SYSTEM_TR, ["a-z", "A-Z"], TEXT)
        )


def test_no_other_tr_on_path_is_one_line():
    result = run_tr(OURS, ["a-z", "A-Z"], TEXT, {**ENV, "PATH": str(BIN)})
    assert result.returncode == 127
    assert result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "no other `tr` on PATH" in lines[0]


def test_first_argument_decides():
    assert is_ours([]) and is_ours(["generate", "-p", "hi"]) and is_ours(["--help"]) and is_ours(["-V"])
    assert is_ours(["--version"]) and is_ours(["--install-completion=bash"]) and is_ours(["--show-completion"])
    for args in (
        ["a-z", "A-Z"],
        ["-d", "x"],
        ["-s", " "],
        ["-c", "a", "b"],
        ["[:lower:]", "[:upper:]"],
        ["--", "generate", "x"],
        ["-h"],
        ["--delete", "x"],
        ["Generate", "x"],
    ):
        assert not is_ours(args), args


def run_ours(
    *args: str, program: str = "tr", env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / program), *args], capture_output=True, text=True, env={**ENV, **(env or {})}, cwd=cwd, timeout=600
    )


@pytest.mark.parametrize("args", [["--version"], ["-V"]])
def test_version_is_ours(args):
    result = run_ours(*args)
    assert result.returncode == 0 and result.stdout.startswith(f"tr {__version__}\ntorch ")


def test_help_is_ours():
    for args in ([], ["--help"]):
        result = run_ours(*args)
        shown = result.stdout + result.stderr
        assert "Usage: tr [OPTIONS] COMMAND" in shown and "generate" in shown, args
    result = run_ours("generate", "--help")
    assert result.returncode == 0 and "Usage: tr generate [OPTIONS]" in result.stdout


def test_token_recycling_never_passes_through():
    result = run_ours("a-z", "A-Z", program="token-recycling")
    assert result.returncode == 2 and "No such command 'a-z'" in result.stderr
    assert "Usage: token-recycling" in run_ours("--help", program="token-recycling").stdout


# --- completion --------------------------------------------------------------------------------


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_completions", ROOT / "scripts" / "generate_completions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_fresh(tmp_path):
    """completions/* and tr_cli/cli_names.py are what the generator makes from the app today."""
    generator = load_generator()
    files = generator.build()
    generator.write(files, tmp_path)
    fix = "stale; run: .venv/bin/python scripts/generate_completions.py"
    for rel in files:
        assert (ROOT / rel).is_file(), f"{rel} missing; run: .venv/bin/python scripts/generate_completions.py"
        assert (ROOT / rel).read_text() == (tmp_path / rel).read_text(), f"{rel} {fix}"
    shipped = ROOT / generator.COMPLETIONS_DIR
    extra = {str(p.relative_to(ROOT)) for p in shipped.rglob("*") if p.is_file()} - set(files)
    assert not extra, f"not generated any more: {sorted(extra)}"
    assert set(files) >= {
        "completions/bash/tr",
        "completions/zsh/_tr",
        "completions/fish/tr.fish",
        "completions/bash/token-recycling",
    }
    assert not (ROOT / "tr_cli" / "cli" / "completions").exists()  # one source: the top-level folder


def test_the_wheel_installs_every_completion_where_its_shell_looks():
    """pyproject.toml's data files put each generated script under the prefix's share/ folder its
    shell searches (bash-completion, zsh's site-functions, fish's vendor_completions.d), by the
    name the shell looks for (scripts/check_installed.py checks an installed wheel has them)."""
    tomllib = pytest.importorskip("tomllib")
    generator = load_generator()
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    expected: dict[str, set[str]] = {}
    for prog in generator.PROGRAMS:
        for shell in generator.SHELLS:
            expected.setdefault(generator.INSTALLED_DIRS[shell], set()).add(generator.completion_path(prog, shell))
    assert {folder: set(files) for folder, files in data_files.items()} == expected
    assert expected["share/bash-completion/completions"] >= {"completions/bash/tr"}
    assert expected["share/zsh/site-functions"] >= {"completions/zsh/_tr"}
    assert expected["share/fish/vendor_completions.d"] >= {"completions/fish/tr.fish"}


def test_install_completion_still_works(tmp_path):
    """`tr --install-completion bash` writes what completions/bash/tr holds (less its header)."""
    result = run_ours(
        "--install-completion", "bash", env={"HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    )
    assert result.returncode == 0, result.stderr
    installed = (tmp_path / ".bash_completions" / "tr.sh").read_text()
    shipped = (ROOT / "completions" / "bash" / "tr").read_text()
    assert (
        installed.strip()
        == "\n".join(line for line in shipped.splitlines() if not line.startswith("# Generated")).strip()
    )
    assert "_TR_COMPLETE=complete_bash" in installed


def bash_complete(line: str, program: str = "tr", cwd: Path | None = None, env: dict | None = None) -> list[str]:
    """What the shipped bash script asks the program for when <TAB> is pressed at the end of `line`."""
    words = line.split(" ")
    var = "_{}_COMPLETE".format(program.replace("-", "_").upper())
    result = run_ours(
        program=program,
        cwd=cwd,
        env={"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1), var: "complete_bash", **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_subcommand_completes_through_typer_env_var():
    assert bash_complete("tr gen") == ["generate"]
    assert bash_complete("token-recycling gen", program="token-recycling") == ["generate"]
    assert "--max-new-tokens" in bash_complete("tr generate --max")


def test_shipped_bash_script_completes(tmp_path):
    """Source completions/bash/tr in a real bash and press <TAB> after `tr gen` and `tr generate sm`."""
    script = (
        f"source {ROOT / 'completions' / 'bash' / 'tr'}; "
        'COMP_WORDS=(tr gen); COMP_CWORD=1; _tr_completion tr; printf "%s\\n" "${COMPREPLY[@]}"; '
        'COMP_WORDS=(tr generate sm); COMP_CWORD=2; _tr_completion tr; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(
        ["bash", "--norc", "-c", script], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["generate", "smollm2"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_shipped_fish_script_completes(tmp_path):
    script = f'source {ROOT / "completions" / "fish" / "tr.fish"}; complete -C "tr gen"'
    result = subprocess.run(
        ["fish", "--no-config", "-c", script], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == ["generate"]


def model_fixture(tmp_path: Path) -> tuple[Path, Path]:
    """A working directory with models and other files, and a hub cache with one cached model."""
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "config.json").write_text("{}")
    (work / "sub").mkdir()
    (work / ".hidden").mkdir()
    (work / "model.Q4_K_M.gguf").write_bytes(b"GGUF")
    (work / "notes.txt").write_text("x")
    hub = tmp_path / "hub"
    for repo, with_config in (("org/tiny-model", True), ("org/no-config", False)):
        folder = hub / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("abc123")
        (folder / "snapshots" / "abc123").mkdir(parents=True)
        if with_config:
            (folder / "snapshots" / "abc123" / "config.json").write_text("{}")
    (hub / "datasets--org--data").mkdir()
    return work, hub


def test_model_argument_completes_through_typer_env_var(tmp_path):
    work, hub = model_fixture(tmp_path)
    got = bash_complete("tr generate ", cwd=work, env={"HF_HUB_CACHE": str(hub)})
    assert got == ["smollm2", "ckpt", "model.Q4_K_M.gguf", "sub/", "org/tiny-model"]


def test_complete_model(tmp_path, monkeypatch):
    work, hub = model_fixture(tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    values = lambda incomplete: [value for value, _ in complete_model(incomplete)]  # noqa: E731
    assert values("") == ["smollm2", "ckpt", "model.Q4_K_M.gguf", "sub/", "org/tiny-model"]
    assert values("m") == ["model.Q4_K_M.gguf"]
    assert values("./s") == ["./sub/"]
    assert values(".") == [".hidden/"]
    assert values("org/") == ["org/tiny-model"]
    assert values(str(work) + "/c") == [str(work / "ckpt")]
    monkeypatch.setenv("HOME", str(work))
    assert values("~/mo") == ["~/model.Q4_K_M.gguf"]
    assert dict(complete_model("sm"))["smollm2"] == "packaged model"
    assert cached_hub_models(tmp_path / "missing") == []


def test_hub_cache_location(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert hf_hub_cache() == Path("/x/huggingface/hub")
    monkeypatch.setenv("HF_HOME", "/h")
    assert hf_hub_cache() == Path("/h/hub")
    monkeypatch.setenv("HF_HUB_CACHE", "/c")
    assert hf_hub_cache() == Path("/c")


def test_complete_matrix(monkeypatch, tmp_path):
    monkeypatch.setenv("TR_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert stored_matrices() == [] and [c for c in complete_matrix("") if c[1] == "stored matrix"] == []
    matrices = tmp_path / "data" / "matrices"
    matrices.mkdir(parents=True)
    # The recycled store beside a matrix is not offered as one.
    for name in (
        "abc-v49152-k8.safetensors",
        "abc-v49152-k8.store.safetensors",
        "def-v32000-k8.safetensors",
        "notes.txt",
    ):
        (matrices / name).write_bytes(b"")
    paths = [str(matrices / "abc-v49152-k8.safetensors"), str(matrices / "def-v32000-k8.safetensors")]
    assert stored_matrices() == paths
    assert complete_matrix(str(matrices / "a")) == [(paths[0], "stored matrix")]
    assert ("smollm2", "packaged model") in complete_matrix("smo")  # a model names its stored matrix too
