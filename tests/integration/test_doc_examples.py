"""Every ``kvlab`` command example in README.md and docs/*.md runs as printed, offline, and prints the figures its
comment quotes — or is listed here as too long for the suite, needing the network or a GPU, with the reason.

Examples are read from the ```bash and plain ``` blocks (an edit there is what is tested); a synopsis's optional ``[...]`` groups
are dropped; each runs in-process (``kvlab.cli.main``) in a fresh temporary folder, so the files it writes land
there. A number with a thousands separator or a decimal point in the example's comment (``128 KiB/token`` is not
one, ``23,040 B/token`` and ``8.4 ms`` are) must appear in what the command printed.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kvlab.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# example (as written, comment removed) -> why the suite does not run it
NOT_RUN = {
    "kvlab models get smollm2-135m": "installs a package with pip (the real-model tests and .ci/run cover it)",
    "kvlab eval --model smollm2-135m": "18 minutes (docs/EVAL.md); the real-model tests run a small cell",
    "kvlab eval --model smollm2-135m --quick": "2-3 minutes; the real-model tests run a small cell",
    "kvlab eval": "2.5 minutes; tests/integration/test_eval_reference.py runs a small matrix",
    "kvlab eval --quick": "30-60 s of the suite's time; test_eval_reference.py covers the path",
    "kvlab eval --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --label qwen05b": "needs the hub and CUDA",
    "kvlab eval --contexts 512,2048,4096 --residual 128 --group-size 32 --candidates dynamic,kivi-4,kivi-2": (
        "minutes; test_eval_reference.py covers the path"
    ),
    "kvlab report results/qwen05b.json": "reads the result of the Qwen example above",
    "kvlab eval --resume results/<label>.json": "needs an interrupted run; tests/unit/eval/test_eval_resume*.py",
    "kvlab report results/qwen05b.json --html report.html": "reads the result of the Qwen example above",
    "kvlab lab eviction": "5 minutes; tests/unit/lab and test_eviction_reference.py cover it",
    "kvlab lab eviction --json": "5 minutes; tests/unit/lab and test_eviction_reference.py cover it",
    "kvlab bench lab": "a benchmark (its exit status is its target, met or not on a busy machine)",
    "kvlab inspect --tokens 4096 --json kv.json --figure kv.png": "a minute and more; tests/unit/eval covers inspect",
    "kvlab lab --repeat 3 --threads 1": "three timed rounds of the toy lab; `kvlab lab` runs here",
    "kvlab figures --out figures/": "runs the toy lab, paging and video again; tests/unit/figures cover it",
    "kvlab figures": "runs the toy lab, paging and video again; tests/unit/figures cover it",
    "kvlab sensitivity sweep --model smollm2-135m --context 1024 --continuation 16 --prompts 4 --offset 50000 "
    "--out sweep.json": "12 minutes; tests/unit/bench/test_sensitivity.py runs the sweep on a tiny model",
    "kvlab sensitivity allocate sweep.json --budget kivi-k4v2 --name smollm2-b3 --out-dir plans": (
        "reads the sweep of the example above; tests/unit/bench/test_sensitivity.py runs allocate"
    ),
    "kvlab eval --model smollm2-135m --quick --contexts 1024 --new-tokens 32 "
    "--kivi-attention dequantize --batch 4 --quality-tokens 32 --candidates "
    "dynamic,kivi-4,kivi-k4v2,kivi-2,fp8-e4m3,mixed-smollm2-b4,mixed-smollm2-b3": (
        "23 minutes, and reads the plans of the examples above"
    ),
    "kvlab eval --model smollm2-135m --quick --contexts 1024 --new-tokens 32 "
    "--kivi-attention dequantize --batch 4 --quality-tokens 32 --candidates "
    "dynamic,kivi-4,kivi-k4v2,kivi-k2v4,kivi-2,fp8-e4m3,mixed-smollm2-b4f,mixed-smollm2-b3f --threads 1 "
    "--label eval-mixed-verify-smollm2-1024": "48 minutes; its record is committed and verified below",
    "kvlab sensitivity verify docs/examples/mixed/eval-mixed-verify-smollm2-1024.json": (
        "a repository path; test_the_committed_mixed_record_wins_at_both_budgets runs it from the root"
    ),
    "kvlab tasks --quick --out tasks.json": "minutes on the bundled model; tests/unit/eval/test_tasks_cli.py runs a cell",
    "kvlab tasks --resume tasks.json": "needs a stopped run; tests/unit/eval/test_tasks_interrupt.py stops and resumes one",
    **dict.fromkeys(
        (
            "kvlab report tasks.json --html tasks.html",
            "kvlab report results/<label>.json tasks.json --html report.html",
            "kvlab figures --out figures --result kvlab-tasks.json",
            "kvlab figures --out figures --result results/LABEL.json --result kvlab-tasks.json",
            "kvlab report kvlab-tasks.json",
            "kvlab report kvlab-tasks.json --html tasks.html",
            "kvlab report results/LABEL.json kvlab-tasks.json --html report.html",
        ),
        "reads the result of a kvlab tasks run; tests/unit/figures/test_tasks_figure_report.py renders one",
    ),
    "kvlab figures --sweep docs/examples/mixed/sensitivity-smollm2-1024.json --plan "
    "docs/examples/mixed/plans/smollm2-b4f.json --no-probe --no-append": (
        "draws the other figures too; tests/unit/figures/test_sensitivity_figure.py draws this one"
    ),
    "kvlab sensitivity verify docs/examples/mixed/eval-mixed-smollm2-1024.json": (
        "exits 1 (one of the two plans does not win); tests/unit/bench/test_sensitivity.py covers the verdict"
    ),
}
# example -> the exit status its text documents (a missing input file is bad input)
EXPECTED_STATUS = {
    "kvlab plan ./my-model/ --gpu-mem-gib 80 --reserve-gib 4": 2,  # a placeholder for the user's own model
    "kvlab paging simulate --trace t.csv --policies paged,paged+prefix --json": 2,  # user's trace
}
# example -> numbers of its comment that are not the command's output (with why)
NOT_PRINTED = {
    "kvlab paging static": {"81,920"},  # the GPU's MiB, named in the comment to explain 80 GiB
}


def _examples() -> list[tuple[str, str, str]]:
    """``(file name, command, comment)`` of every kvlab line in a bash, sh or plain block (a ``\\`` continuation
    joined; a printed eval summary's first line, ``kvlab eval <label> — status ...``, is output, not a command)."""
    found = []
    for path in DOCS:
        in_block, lang, pending = False, "", ""
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                in_block, lang = (not in_block), line[3:].strip()
                continue
            if not in_block or lang not in ("bash", "sh", ""):
                continue
            text = pending + line.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            command, _, comment = text.partition(" # ")
            command = re.sub(r"\s*\[[^\]]*\]", "", command).strip()  # a synopsis's optional groups
            if (
                command.startswith("kvlab ") and " — status " not in command
            ):  # not a printed summary's first line
                found.append((path.name, " ".join(command.split()), comment))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples_and_every_listed_exception_is_one_of_them():
    commands = {c for _, c, _ in EXAMPLES}
    assert len(commands) >= 25, commands
    stale = {*NOT_RUN, *EXPECTED_STATUS, *NOT_PRINTED} - commands
    assert not stale, f"listed here but no longer in the docs: {sorted(stale)}"


def _quoted_numbers(comment: str) -> set[str]:
    return set(re.findall(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+", comment))


@pytest.mark.parametrize(
    "doc, command, comment",
    [e for e in EXAMPLES if e[1] not in NOT_RUN],
    ids=[f"{d}:{c}" for d, c, _ in EXAMPLES if c not in NOT_RUN],
)
def test_example_runs_as_printed(doc, command, comment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the committed plans, as the docs' `export KVLAB_PLAN_DIR=docs/examples/mixed/plans` sets them
    monkeypatch.setenv("KVLAB_PLAN_DIR", str(ROOT / "docs" / "examples" / "mixed" / "plans"))
    monkeypatch.setenv("COLUMNS", "200")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(shlex.split(command)[1:])
    expected = EXPECTED_STATUS.get(command, 0)
    assert code == expected, (
        f"{doc}: `{command}` exited {code}, expected {expected}\n{err.getvalue()[-2000:]}"
    )
    printed = " ".join((out.getvalue() + err.getvalue()).split())
    missing = (
        _quoted_numbers(comment)
        - NOT_PRINTED.get(command, set())
        - {n for n in _quoted_numbers(comment) if n in printed}
    )
    assert not missing, f"{doc}: `{command}` did not print {sorted(missing)} from its comment `{comment}`"


def _row_labels(block: str) -> list[str]:
    """The first column of every table row of a rich table as printed (continuation rows left out)."""
    cells = [line.split("│")[1].strip() for line in block.splitlines() if line.startswith("│")]
    return [c for c in cells if c]


def test_eviction_doc_output_block_has_every_row_the_plan_prints(monkeypatch):
    """docs/EVICTION.md shows the output of its --keep-tokens plan: the rows it shows are the rows printed now."""
    command = "kvlab plan llama-3-8b --context 8192 --batch 32 --kv-dtype kivi-4 --keep-tokens 1024"
    text = (ROOT / "docs" / "EVICTION.md").read_text(encoding="utf-8")
    after = text[text.index(f"`{command}`") :]
    block = after[after.index("```\n") + 4 :]
    block = block[: block.index("```")]
    monkeypatch.setenv("COLUMNS", "120")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(shlex.split(command)[1:]) == 0
    assert _row_labels(block) == _row_labels(out.getvalue())
    assert "of which scales/zeros (2 B each)" in _row_labels(block)


def test_the_committed_mixed_record_wins_at_both_budgets(monkeypatch):
    """docs/MIXED.md's one-run record: `kvlab sensitivity verify` exits 0 and both floored plans win."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["sensitivity", "verify", "docs/examples/mixed/eval-mixed-verify-smollm2-1024.json"])
    assert code == 0, out.getvalue()
    wins = [line for line in out.getvalue().splitlines() if "WINS" in line]
    assert [w.split()[1] for w in wins] == ["mixed-smollm2-b4f", "mixed-smollm2-b3f"], out.getvalue()
    for uniform in ("kivi-4", "kivi-k4v2", "kivi-k2v4", "kivi-2"):
        assert uniform in out.getvalue()
