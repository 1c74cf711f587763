"""Words of the README and docs a newcomer can read: R and G (KIVI's residual window and group size, the tables'
``R/G`` column) defined where they are first used, and one name for one metric: "top-k overlap" as the CLI, the
HTML report and the figures print it (the README said "top-5" where the tables say "top-k")."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_r_and_g_are_defined_in_the_paragraph_that_first_uses_them():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"\bR=\d|\bR/G\b|\bG and R\b|\bG=\d", text)
    assert first, "the README no longer uses R or G: drop this test"
    paragraph_end = text.find("\n\n", first.start())
    upto = text[: paragraph_end if paragraph_end > 0 else len(text)]
    assert "R is KIVI's\nresidual window" in upto or "R is KIVI's residual window" in upto
    assert "G its group size" in upto


def test_one_name_for_the_top_k_overlap():
    found = [
        f"{p.name}:{i}"
        for p in PAGES
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\btop-\d", line)
    ]
    assert not found, "say top-k (k = 5, the eval's top_k), as kvlab prints it: " + ", ".join(found)


def test_the_readme_links_the_per_layer_bit_allocation_page_where_it_names_mixed_caches():
    """docs/MIXED.md (sensitivity sweep, allocation, mixed-<plan>, verify) was reachable from no README line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / "MIXED.md").is_file()
    paragraphs = [p for p in text.split("\n\n") if "mixed-<plan>" in p]
    assert paragraphs, "the README no longer names mixed-<plan>"
    assert "[docs/MIXED.md](docs/MIXED.md)" in paragraphs[0] and "bit allocation" in paragraphs[0]


def test_the_quick_start_stays_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, re.S)
    assert block and block.group(1).splitlines() == [
        'pip install "torch==2.13.0" -e ".[hf,dev]" && kvlab eval',
        "python -m pytest -q",
    ]


def test_the_readmes_error_example_is_what_the_command_prints(capsys):
    """The README's example error line said "`block_size_tokens` must be >= 1" (the library's argument name); the
    command says "--block-size must be >= 1" (the flag typed). The example is run and compared."""
    from kvlab.cli import main

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"example `(kvlab paging static: error: [^`]+)`", text)
    assert example, "the README no longer shows its error example: drop this test"
    assert main(["paging", "static", "--block-size", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == example.group(1)


def test_the_readme_states_no_test_count_as_the_current_one():
    """The README said the suite had "3,195 on 2026-12-05, more as the project grows" when ~3,800 were collected:
    it gives the command that counts the tests, and every count it names is a dated timing record ("took")."""
    paragraphs = (ROOT / "README.md").read_text(encoding="utf-8").split("\n\n")
    (suite,) = [" ".join(p.split()) for p in paragraphs if "python -m pytest --collect-only -q | tail -1" in p]
    counts = list(re.finditer(r"\b\d,\d{3}\b", suite))
    assert counts, "the paragraph names no test count: drop this test"
    for m in counts:  # each count's clause, up to its ';' or ')'
        clause = re.split(r"[;)]", suite[m.start() :], maxsplit=1)[0]
        assert " took " in clause, f"a test count that is not a timing record: {clause!r}"
    assert "as the project grows" not in suite
