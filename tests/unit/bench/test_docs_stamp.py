"""``kvlab bench docs`` never silently overwrites a page edited by hand.

A user appended a line to docs/PERFORMANCE.md in a checkout; ``kvlab bench docs`` rewrote the page (exit 0, "wrote
docs/PERFORMANCE.md") and the line was gone: --force only protected pages the command had not generated. The page
now carries the sha256 of the text the command wrote; a page that no longer matches it is refused, naming the file
and --force, while the page regenerated after new records, untouched since, is rewritten without --force.
"""

import json
import shutil
from pathlib import Path

import pytest

from kvlab.bench import docs
from kvlab.cli import main

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """Two of the committed records, copied: a folder a new record can be added to."""
    folder = tmp_path / "results"
    folder.mkdir()
    for name in sorted(p.name for p in RESULTS.glob("decode-*.json"))[:2]:
        shutil.copy(RESULTS / name, folder / name)
    return folder


def _docs(results_dir: Path, page: Path, *extra: str) -> int:
    return main(["bench", "docs", "--results-dir", str(results_dir), "--out", str(page), *extra])


def test_a_hand_edited_page_is_refused_naming_the_file_and_force(results_dir, tmp_path, capsys):
    page = tmp_path / "PERFORMANCE.md"
    assert _docs(results_dir, page) == 0
    page.write_text(page.read_text(encoding="utf-8") + "Hand note: measured on a quiet machine.\n", encoding="utf-8")
    capsys.readouterr()
    assert _docs(results_dir, page) != 0
    err = capsys.readouterr().err
    assert str(page) in err and "edited" in err and "--force" in err, err
    assert "Hand note" in page.read_text(encoding="utf-8")  # kept
    assert _docs(results_dir, page, "--force") == 0
    assert "Hand note" not in page.read_text(encoding="utf-8")


def test_an_unedited_page_is_regenerated_after_a_new_record_without_force(results_dir, tmp_path):
    page = tmp_path / "PERFORMANCE.md"
    assert _docs(results_dir, page) == 0
    before = page.read_text(encoding="utf-8")
    extra = RESULTS / "flush-cpu.json"  # a record of another benchmark: a section of its own
    assert json.loads(extra.read_text(encoding="utf-8"))["benchmark"] == "flush"
    shutil.copy(extra, results_dir / extra.name)
    assert _docs(results_dir, page) == 0
    after = page.read_text(encoding="utf-8")
    assert "flush-cpu.json" not in before and "flush-cpu.json" in after


def test_a_page_with_the_marker_but_no_stamp_is_refused(results_dir, tmp_path):
    page = tmp_path / "PERFORMANCE.md"
    page.write_text(f"# Performance\n\n{docs.MARKER}\n\nold numbers\n", encoding="utf-8")
    with pytest.raises(FileExistsError, match="no sha256 line"):
        docs.write_page(results_dir, page)
    docs.write_page(results_dir, page, force=True)
    docs.write_page(results_dir, page)  # stamped now: regenerated as it is


def test_the_stamp_hashes_the_page_without_its_own_line(results_dir, tmp_path):
    import hashlib

    text = docs.write_page(results_dir, tmp_path / "P.md").read_text(encoding="utf-8")
    stamp = next(line for line in text.splitlines() if line.startswith("<!-- sha256 "))
    digest = stamp.split()[2]
    assert hashlib.sha256(text.replace(stamp + "\n", "").encode("utf-8")).hexdigest() == digest


def test_a_page_that_is_not_utf8_text_is_refused_naming_the_file_and_force(results_dir, tmp_path, capsys):
    """--out naming a binary file (a gzip archive) failed with a bare "'utf-8' codec can't decode byte 0x8b in
    position 1", no file named; it is refused as a page not generated, and --force still overwrites it."""
    page = tmp_path / "PERFORMANCE.md"
    page.write_bytes(b"\x1f\x8b\x08\x00binary")
    assert _docs(results_dir, page) != 0
    err = capsys.readouterr().err
    assert f"{page} is not a UTF-8 text page (byte 1 is 0x8b)" in err and "--force" in err
    assert "codec" not in err and page.read_bytes().startswith(b"\x1f\x8b")
    assert _docs(results_dir, page, "--force") == 0
    assert docs.MARKER in page.read_text(encoding="utf-8")
