"""The layout's dependency rule, read off the import statements of every module of the package.

Dependencies point down: core imports nothing of the rest; errors only core; models, store and
text only core and errors; engine those; chat, bench and serve the engine and below (not each
other); cli anything; the `tr` shim (entry, cli_names) only the standard library and, to start
the app, cli. Only cli knows Typer, Rich, click and prompt-toolkit.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tr_cli"
RANKS = {
    "core": 0,
    "errors": 1,
    "models": 2,
    "store": 2,
    "text": 2,
    "engine": 3,
    "chat": 4,
    "bench": 4,
    "serve": 4,
    "cli": 5,
    "cli_names": 0,
    "entry": 6,
    "__main__": 6,
    "data": 0,
    "seed": 0,
}
SHIM = ("entry", "cli_names")
TERMINAL_LIBRARIES = {"typer", "click", "rich", "prompt_toolkit"}


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = package.split(".")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
            out += [(node.lineno, name) for name in names]
    return out


def violations(root: Path) -> list[str]:
    """Every import in the package at `root` that breaks the rule, as 'file:line: what'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).with_suffix("")
        parts = list(relative.parts)
        package = ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")
        own = parts[1] if len(parts) > 1 else "__init__"
        if own == "__init__":
            continue  # the package root: the version only
        for line, module in imported_modules(path, package):
            where = f"{path.relative_to(root.parent)}:{line}"
            top, *rest = module.split(".")
            if top == root.name:
                if not rest or rest == ["__version__"]:
                    continue  # the package root holds the version only
                target = rest[0]
                if own in SHIM and target not in SHIM and target != "cli":
                    found.append(f"{where}: the shim imports {module} (standard library only)")
                elif target != own and RANKS.get(target, 99) >= RANKS.get(own, -1) and own not in SHIM:
                    found.append(f"{where}: {own} imports {module}, which is not below it")
            elif top in TERMINAL_LIBRARIES and own != "cli":
                found.append(f"{where}: {own} imports {module} (only cli knows the terminal)")
            elif own in SHIM and top not in sys.stdlib_module_names:
                found.append(f"{where}: the shim imports {module} (standard library only)")
    return found


def test_no_module_imports_upwards():
    assert violations(PACKAGE) == []


def test_every_top_level_name_is_a_package_or_the_shim():
    allowed_files = {"__init__.py", "__main__.py", "entry.py", "cli_names.py", "errors.py"}
    for entry in PACKAGE.iterdir():
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            assert (entry / "__init__.py").is_file(), f"{entry.name}/ is not a package"
            assert entry.name in RANKS, f"{entry.name}/ has no place in the layer order"
        else:
            assert entry.name in allowed_files, f"tr_cli/{entry.name} is a loose module; put it in its package"


@pytest.mark.parametrize(
    "source, rule",
    [
        ("from ..cli import app\n", "core imports tr_cli.cli"),
        ("from ...store.paths import data_dir\n", "core imports tr_cli.store"),
        ("import rich\n", "only cli knows the terminal"),
    ],
)
def test_the_check_catches_an_upward_import(tmp_path, source, rule):
    fake = tmp_path / "tr_cli"
    (fake / "core" / "drafters").mkdir(parents=True)
    for package in (fake, fake / "core", fake / "core" / "drafters"):
        (package / "__init__.py").write_text("")
    target = fake / "core" / ("drafters/bad.py" if source.startswith("from ...") else "bad.py")
    target.write_text(source)
    found = violations(fake)
    assert len(found) == 1 and rule in found[0]
