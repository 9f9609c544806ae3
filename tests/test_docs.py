"""The repository documents itself: no citation points outside it, and every link and cited section resolves.

Docstrings, configs and the generated leaderboard cite ``docs/*.md`` pages, their headings and the numbered sections
of ``docs/published-numbers.md``. A reader (or a reviewer of a fresh clone) must be able to follow every one of
them, so these tests check, over the tracked files:

1. no file mentions the private notes the code was first written against (they are not part of the repository);
   the names are assembled at run time, so this file does not trip its own check;
2. every relative markdown link resolves to an existing file, and an ``#anchor`` into a markdown file to one of its
   headings under GitHub's slug rule;
3. every ``docs/<page>.md`` path cited in code or text exists (with its ``#anchor``, if any), and every ``§`` number
   cited next to ``published-numbers.md`` is one of that page's numbered sections.

Each checker is a function of a root folder and a list of files, so the last tests run it on a deliberately broken
copy and prove that it can fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[1]
TEXT_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg")
# Concatenated so that this file never contains them verbatim.
FORBIDDEN = (
    "algorithms" + ".md",
    "paper_tables" + ".md",
    "lmeval_decoding" + ".md",
    "shared" + "/reference",
    ".." + "/shared",
)
SKIP_PARTS = {".git", ".venv", "venv", "build", "dist", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
PUBLISHED_PAGE = "docs/published-numbers.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+).*?\1")
_LINK = re.compile(r"!?\[[^\[\]]*\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_DOC_CITATION = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
_SECTION = re.compile(r"§\s?(\d+(?:\.\d+)?)(?:\s?[-–]\s?(\d+(?:\.\d+)?))?")
_NUMBERED_HEADING = re.compile(r"^(\d+(?:\.\d+)?)\.?\s")


# ------------------------------------------------------------------------------------------------- helpers
def tracked_files(root: Path) -> list[Path]:
    """Text files of the repository: ``git ls-files`` in a checkout, else a walk that skips build and venv folders."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        paths = [root / name for name in listing.decode("utf-8").split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*") if not SKIP_PARTS.intersection(p.relative_to(root).parts)]
    return sorted(p for p in paths if p.suffix in TEXT_SUFFIXES and p.is_file())


def _prose_lines(markdown: str) -> list[str]:
    """The lines of ``markdown`` with fenced code blocks blanked and inline code removed (line numbers kept)."""
    lines, in_fence = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            lines.append("")
        else:
            lines.append("" if in_fence else _INLINE_CODE.sub("", line))
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"!?\[([^\[\]]*)\]\([^()]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def heading_anchors(markdown: str) -> set[str]:
    """Every anchor GitHub generates for the headings of ``markdown`` (repeats get ``-1``, ``-2``, ...)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else _HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def markdown_links(markdown: str) -> list[tuple[int, str]]:
    """``(line number, target)`` of every inline link and image outside code."""
    text = "\n".join(_prose_lines(markdown))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(text)]


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


# ------------------------------------------------------------------------------------------------ checkers
def forbidden_mentions(root: Path, files: list[Path]) -> list[str]:
    """``file:line: name`` for every mention of a note that is not part of the repository."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{_rel(root, path)}:{number}: {name}" for name in FORBIDDEN if name in line]
    return found


def broken_links(root: Path, markdown_files: list[Path]) -> list[str]:
    """``file:line: target (why)`` for every relative link whose file, or markdown heading, does not exist."""
    broken = []
    for path in markdown_files:
        for number, target in markdown_links(path.read_text(encoding="utf-8")):
            if not target or _URL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{_rel(root, path)}:{number}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text("utf-8")):
                broken.append(f"{where} (no heading with this anchor)")
    return broken


def broken_doc_citations(root: Path, files: list[Path]) -> list[str]:
    """``file:line: docs/page.md#anchor (why)`` for every cited docs page or anchor that does not exist."""
    broken = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in _DOC_CITATION.finditer(line):
                page, anchor = root / "docs" / match.group(1), match.group(2)
                where = f"{_rel(root, path)}:{number}: {match.group(0)}"
                if not page.is_file():
                    broken.append(f"{where} (no such page)")
                elif anchor and anchor not in heading_anchors(page.read_text(encoding="utf-8")):
                    broken.append(f"{where} (no heading with this anchor)")
    return broken


def published_sections(root: Path) -> set[str]:
    """The section numbers of ``docs/published-numbers.md`` ("1", "1.4", "5.2", ...)."""
    page = root / PUBLISHED_PAGE
    sections = set()
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        number = _NUMBERED_HEADING.match(match.group(2)) if match else None
        if number:
            sections.add(number.group(1))
    return sections


def broken_section_numbers(root: Path, files: list[Path]) -> list[str]:
    """``file:line: §n`` for every section number, in a file citing the published-numbers page, that it lacks."""
    sections = published_sections(root)
    broken = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if Path(PUBLISHED_PAGE).name not in text:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in _SECTION.finditer(line):
                missing = [n for n in match.groups() if n is not None and n not in sections]
                broken += [f"{_rel(root, path)}:{number}: §{n}" for n in missing]
    return broken


def _markdown(files: list[Path]) -> list[Path]:
    return [p for p in files if p.suffix == ".md"]


# -------------------------------------------------------------------------------------------- the repository
@pytest.fixture(scope="module")
def files() -> list[Path]:
    found = tracked_files(ROOT)
    assert ROOT / "README.md" in found and ROOT / "docs" / "README.md" in found
    return found


def test_no_file_cites_notes_outside_the_repository(files: list[Path]) -> None:
    assert forbidden_mentions(ROOT, files) == []


def test_markdown_links_resolve(files: list[Path]) -> None:
    markdown = _markdown(files)
    assert {ROOT / "README.md", ROOT / "docs" / "methods.md", ROOT / "leaderboard.md"} <= set(markdown)
    assert broken_links(ROOT, markdown) == []


def _citing(files: list[Path]) -> list[Path]:
    """The files whose citations must resolve: all but this one, whose broken examples are deliberate."""
    return [p for p in files if p != THIS_FILE]


def test_docs_pages_cited_anywhere_exist(files: list[Path]) -> None:
    assert broken_doc_citations(ROOT, _citing(files)) == []


def test_cited_section_numbers_of_the_published_numbers_page_exist(files: list[Path]) -> None:
    assert {"1.4", "1.5", "5.2", "5.5", "5.6"} <= published_sections(ROOT)
    assert broken_section_numbers(ROOT, _citing(files)) == []


def test_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for _, target in markdown_links(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked


def test_docs_index_names_every_estimator_and_method() -> None:
    """The index's rows for estimators.md and methods.md name every registered estimator and every method section
    of methods.md (it once said "the five methods" of eight, and listed five of seven estimators)."""
    from stabledrl_bench.core.estimators import ESTIMATORS

    rows = {
        page: next(line for line in (ROOT / "docs" / "README.md").read_text().splitlines() if f"[{page}]" in line)
        for page in ("estimators.md", "methods.md")
    }
    assert [name for name in ESTIMATORS if f"`{name}`" not in rows["estimators.md"]] == []
    names = [section.splitlines()[0] for section in (ROOT / "docs" / "methods.md").read_text().split("\n## ")]
    sections = [name for name in names[names.index("GRPO") : names.index("Reward profiles")] if "ablations" not in name]
    assert "GDPO" in sections and [name for name in sections if name.lower() not in rows["methods.md"].lower()] == []


# ------------------------------------------------------------------------------------------- the checkers fail
@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("## GRPO", "grpo"),
        ("## `d1_one_step`", "d1_one_step"),
        (
            "### 5.2 Spike mechanism 1: the conditional-clipping bypass",
            "52-spike-mechanism-1-the-conditional-clipping-bypass",
        ),
        ("## 1. StableDRL's own results", "1-stabledrls-own-results"),
        ("## tracerl-static and tracerl-dynamic", "tracerl-static-and-tracerl-dynamic"),
        ("## See [the docs](docs/README.md) / more", "see-the-docs--more"),
    ],
)
def test_github_slug(heading: str, anchor: str) -> None:
    assert heading_anchors(heading) == {anchor}


def test_repeated_headings_get_numbered_anchors() -> None:
    text = "# A\n## Notes\n```\n## Not a heading\n```\n## Notes\n## Notes\n"
    assert heading_anchors(text) == {"a", "notes", "notes-1", "notes-2"}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_checkers_find_what_a_broken_tree_breaks(tmp_path: Path) -> None:
    docs = _write(tmp_path / "docs" / "page.md", "# Page\n\n## Real section\n\nSee [self](#real-section).\n")
    _write(tmp_path / PUBLISHED_PAGE, "# Published\n\n## 1. Results\n\n### 1.4 Stress test\n")
    readme = _write(
        tmp_path / "README.md",
        "[ok](docs/page.md#real-section) [gone](docs/missing.md) [bad anchor](docs/page.md#nowhere)\n"
        "[web](https://example.org/x.md) `[code](docs/missing.md)`\n\n```\n[fenced](nothing.md)\n```\n"
        "[self ok](#readme) [self bad](#nope)\n\n# README\n",
    )
    good = _write(tmp_path / "good.py", '"""See docs/page.md#real-section and docs/published-numbers.md §1.4."""\n')
    bad = _write(
        tmp_path / "bad.py",
        f'"""{FORBIDDEN[0]}; docs/missing.md; docs/page.md#nowhere; docs/published-numbers.md §1.4-1.9, §7."""\n',
    )
    files = [docs, readme, good, bad, tmp_path / PUBLISHED_PAGE]

    assert forbidden_mentions(tmp_path, files) == [f"bad.py:1: {FORBIDDEN[0]}"]
    assert broken_links(tmp_path, _markdown(files)) == [
        "README.md:1: docs/missing.md (no such file)",
        "README.md:1: docs/page.md#nowhere (no heading with this anchor)",
        "README.md:7: #nope (no heading with this anchor)",
    ]
    assert broken_doc_citations(tmp_path, [good, bad]) == [
        "bad.py:1: docs/missing.md (no such page)",
        "bad.py:1: docs/page.md#nowhere (no heading with this anchor)",
    ]
    assert broken_section_numbers(tmp_path, files) == ["bad.py:1: §1.9", "bad.py:1: §7"]
    for check in (forbidden_mentions, broken_links, broken_doc_citations, broken_section_numbers):
        assert check(tmp_path, [good, docs]) == []


def test_checkers_catch_a_broken_copy_of_the_real_docs(tmp_path: Path, files: list[Path]) -> None:
    """Copy the tracked text files (and the plots the leaderboard and the benchmark reports show), then break one
    heading, one page, one section and add one leaked citation: the copy passes before and each check fails after."""
    copies = []
    plots = [*ROOT.glob("results/**/*.png"), *ROOT.glob("benchmarks/reports/*.png")]  # what the pages link to
    for path in [*_citing(files), *plots]:
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copies.append(target)
    copies = [p for p in copies if p.suffix in TEXT_SUFFIXES]
    assert not broken_links(tmp_path, _markdown(copies)) and not broken_doc_citations(tmp_path, copies)

    estimators = tmp_path / "docs" / "estimators.md"
    estimators.write_text(estimators.read_text("utf-8").replace("## spg_block", "## spg-block"), "utf-8")
    (tmp_path / "docs" / "protocols.md").unlink()
    published = tmp_path / PUBLISHED_PAGE
    published.write_text(published.read_text("utf-8").replace("### 5.5 ", "### 5.9 "), "utf-8")
    copies = [p for p in copies if p.exists()]
    (tmp_path / "leaked.txt").write_text(f"see {FORBIDDEN[3]}/notes\n", "utf-8")

    links = broken_links(tmp_path, _markdown(copies))
    assert any("estimators.md#spg_block (no heading" in b for b in links)
    assert any("protocols.md" in b and "(no such file)" in b for b in links)
    citations = broken_doc_citations(tmp_path, copies)
    assert any("docs/estimators.md#spg_block" in b for b in citations)
    assert any("docs/protocols.md" in b and "(no such page)" in b for b in citations)
    assert any(b.endswith("§5.5") for b in broken_section_numbers(tmp_path, copies))
    assert forbidden_mentions(tmp_path, [tmp_path / "leaked.txt"]) == [f"leaked.txt:1: {FORBIDDEN[3]}"]
