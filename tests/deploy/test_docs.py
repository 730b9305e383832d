"""The docs stay readable and followable: every setting a service reads is documented, the
README and the performance page keep their word limits, nothing cites files outside the
repository or carries clock times, and every relative link in the docs leads somewhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.services import ROOT, services

# Where run logs live: the one place clock times and host names belong.
RUN_LOGS = ROOT / "benchmarks" / "results"
SKIPPED_DIRS = {".git", ".venv", ".data", ".tools", ".bench", "node_modules", "__pycache__"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt", ".cfg", ".ini", ".html"}
# Spelled in two halves so that this file does not match its own patterns.
OUTSIDE_CITATIONS = re.compile("SPEC" + r" §|shared/" + "MEASURED")
CLOCK_TIME = re.compile(r"\b[0-9]{2}:[0-9]{2} " + "UTC")
# A date in prose is a diary entry ("until <date> the relay ..."): the docs say what holds.
DATE = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _words(path: Path) -> int:
    return len(path.read_text().split())  # what `wc -w` counts


def _repository_text_files() -> Iterator[Path]:
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_DIRS or part.startswith(".pytest") for part in relative.parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Makefile"):
            if not path.is_relative_to(RUN_LOGS):
                yield path


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    names = {name for service in services().values() for name in service.env_names}
    undocumented = sorted(name for name in names if f"`{name}`" not in text)
    assert not undocumented, f"docs/operations.md does not mention {undocumented}"


@pytest.mark.parametrize(("page", "limit"), [("README.md", 1000), ("docs/performance.md", 3000)])
def test_a_page_stays_within_its_word_limit(page: str, limit: int) -> None:
    words = _words(ROOT / page)
    assert words <= limit, f"{page} has {words} words, over its {limit}; move detail elsewhere"


def test_nothing_cites_files_outside_the_repository_or_clock_times() -> None:
    found = []
    for path in _repository_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_CITATIONS.search(line) or CLOCK_TIME.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "cite docs/… and keep run logs in benchmarks/results/:\n" + "\n".join(found)


def _prose_lines(page: Path) -> Iterator[tuple[int, str]]:
    """The lines of a page outside fenced code blocks (an example log line keeps its
    timestamp)."""
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def test_the_docs_state_what_holds_not_when_it_changed() -> None:
    dated = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for page in _doc_pages()
        for number, line in _prose_lines(page)
        if DATE.search(line)
    ]
    assert not dated, "dates belong to benchmarks/results/ and commit messages:\n" + "\n".join(
        dated
    )


def test_the_checks_above_can_fail() -> None:
    assert DATE.search("until " + "2026-12-05 every claim")
    assert not DATE.search("ISO 8601, e.g. `YYYY-MM-DD`")
    assert OUTSIDE_CITATIONS.search("the rule (" + "SPEC" + " §2.2)")
    assert CLOCK_TIME.search("run at 14:44 " + "UTC")
    assert not CLOCK_TIME.search("00:30Z on the 15th")


def test_every_relative_link_in_the_docs_leads_to_a_file() -> None:
    broken = []
    for page in _doc_pages():
        for target, _anchor in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, f"links to nothing: {broken}"
