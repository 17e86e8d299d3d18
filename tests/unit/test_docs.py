"""The user documentation: README.md and docs/*.md.

Every relative link and image resolves to a file of the repository (and an `#anchor` to a heading
of its target, slugged as GitHub slugs it), the README stays a five-minute read, every docs/ page
is reachable from it, and no page points at issue numbers or at paths outside the repository.
"""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [README, *DOCS]
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link and image outside code."""
    found = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            found.append((number, match.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of `path` (a file under `root`), as 'file:line: target: why'."""
    problems = []
    for number, target in links(path):
        if target.startswith(EXTERNAL):
            continue
        where = f"{path.relative_to(root)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{where}: absolute path (links must be relative)")
            continue
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{where}: no such file")
            continue
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where}: outside the repository")
            continue
        if anchor:
            if resolved.suffix != ".md":
                problems.append(f"{where}: anchor into a file that is not markdown")
            elif anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with this anchor in {resolved.name}")
    return problems


def test_there_are_docs_to_check():
    assert README.is_file()
    assert len(DOCS) >= 5
    assert links(README), "README.md has no links at all"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_image_resolves(doc):
    assert broken_links(doc) == []


def test_readme_is_a_five_minute_read():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in links(README)
        if not target.startswith(EXTERNAL)
    }
    assert [doc.name for doc in DOCS if doc.resolve() not in linked] == []


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_no_issue_numbers_or_paths_outside_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    assert re.findall(r"issue \d+", text, flags=re.IGNORECASE) == []
    assert "../shared" not in text


def test_the_picture_is_valid_svg():
    root = ET.parse(ROOT / "docs" / "how-it-works.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_the_checker_finds_what_is_broken(tmp_path):
    (tmp_path / "other.md").write_text("# A page: `tr x`, the one\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "[ok](other.md#a-page-tr-x-the-one) [ok](other.md#twice-1) [web](https://example.com)\n"
        "[missing](nowhere.md) ![image](gone.svg) [bad anchor](other.md#nope) [self](#none)\n"
        "[outside](../page.md) [absolute](/etc/hosts)\n"
        "`[in code](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
    )
    problems = broken_links(doc, root=tmp_path)
    assert [p.split(": ")[1] for p in problems] == [
        "nowhere.md",
        "gone.svg",
        "other.md#nope",
        "#none",
        "../page.md",
        "/etc/hosts",
    ]
    assert slug("The forward underneath, and `--weights`") == "the-forward-underneath-and---weights"
    assert slug("llama.cpp, the reference") == "llamacpp-the-reference"
