"""Words a reader can follow: no "§" and no issue numbers in src/kvlab (a tutorial's section numbers and our issue
tracker are not in the reader's hands; cite a paper's section by the word, or a docs/*.md page), and no reference in
src, docs or tests to a repository file that does not exist ("docs/STYLE", "style habit 9")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# "seed 003 §3.3", "(issue 4)", "issue 33 point 5": pointers into material the repository does not hold
UNREADABLE = re.compile(r"§|\bissues? #?\d+\b", re.IGNORECASE)
# a path into the repository's own top-level folders, as prose writes one
REPO_PATH = re.compile(r"(?<![\w/.-])((?:docs|scripts|benchmarks|tests|src)/[A-Za-z0-9_./*-]*[A-Za-z0-9_*])")
# the style guide lives outside the repository: its habits by number point nowhere for a reader
STYLE_GUIDE = re.compile(r"\bstyle habit\b|(?<!/)\bSTYLE\.md\b", re.IGNORECASE)
TEXT = (".py", ".md", ".txt", ".toml", ".sh", ".c", ".cfg", ".ini", ".yml", ".yaml")


def _tracked(*parts: str) -> list[Path]:
    """Files of ``parts`` in the checkout: tracked ones plus new ones not ignored (a test run before a commit); every
    text file under them where the tree is not a git checkout (an unpacked sdist)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", *parts],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [
            str(f.relative_to(ROOT))
            for part in parts
            for f in ([ROOT / part] if (ROOT / part).is_file() else (ROOT / part).rglob("*"))
            if "__pycache__" not in f.parts
        ]
    return [ROOT / f for f in out if f.endswith(TEXT) and (ROOT / f).is_file()]


def unreadable_words(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``"path:line: text"`` for every "§" or issue number in ``paths``."""
    return [
        f"{p.relative_to(root)}:{i}: {line.strip()[:100]}"
        for p in paths
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if UNREADABLE.search(line)
    ]


def missing_references(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``"path:line: reference"`` for every repository path in ``paths`` that names no file or folder under ``root``,
    and every citation of the style guide (not in the repository)."""
    bad = []
    for p in paths:
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            where = f"{p.relative_to(root)}:{i}"
            bad += [f"{where}: {m.group(0)}" for m in STYLE_GUIDE.finditer(line)]
            for m in REPO_PATH.finditer(line):
                ref = m.group(1).rstrip(".")
                if not ((root / ref).exists() if "*" not in ref else any(root.glob(ref))):
                    bad.append(f"{where}: {ref}")
    return bad


def test_src_has_no_section_signs_or_issue_numbers():
    found = unreadable_words([p for p in _tracked("src") if p.suffix == ".py"])
    assert not found, "cite a paper's section by the word or a docs/*.md page:\n" + "\n".join(found)


def test_src_docs_and_tests_name_only_files_that_exist():
    paths = _tracked("src", "docs", "tests", "README.md", "CONTRIBUTING.md")
    found = missing_references([p for p in paths if p.name != Path(__file__).name])
    assert not found, "references to files the repository does not have:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("see the mechanics chapter §3.4", True),
        ("(issue 33 point 5)", True),
        ("KIVI (arXiv:2402.02750, section 3.1)", False),
        ("one tissue 3 times", False),
    ],
)
def test_the_word_check_sees_what_it_should(tmp_path, text, flagged):
    f = tmp_path / "a.py"
    f.write_text(f'"""{text}"""\n')
    assert bool(unreadable_words([f], root=tmp_path)) is flagged


def test_the_reference_check_sees_a_missing_file_and_the_style_guide(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "EVAL.md").write_text("# eval\n")
    f = tmp_path / "a.md"
    f.write_text("See docs/EVAL.md, docs/E*.md, docs/GONE.md, docs/X*.md and docs/STYLE; style habit 9.\n")
    found = missing_references([f], root=tmp_path)
    assert found == [
        "a.md:1: style habit",
        "a.md:1: docs/GONE.md",
        "a.md:1: docs/X*.md",
        "a.md:1: docs/STYLE",
    ]
