"""``kvlab tasks --merge``: runs split by task merge into the result one run would have given (cells as measured,
gates and decision judged again), and runs that do not belong together are refused, named; the Markdown tables of
docs/TASKS.md are read from a result's cells."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.eval.tasks_judge import judge
from kvlab.eval.tasks_merge import merge_tasks_results
from kvlab.eval.tasks_render import markdown_tables
from kvlab.eval.tasks_schema import upgrade_tasks_result, validate_tasks_result

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "tasks-bundled-512-2026-12-02.json"


def _parts(status: str = "complete") -> tuple[dict, list[dict]]:
    """The example result (a version-1 file, read in the current form) and two version-2 results holding its first
    cell and the others (as written: ``bytes_ratio`` rows)."""
    whole = json.loads(EXAMPLE.read_text())
    parts = []
    for cells in (whole["cells"][:1], whole["cells"][1:]):
        r = copy.deepcopy(whole)
        r.update(version=2, status=status, created_utc="2026-12-03T00:00:00+00:00", command=None, failures=[])
        r["cells"] = copy.deepcopy(cells)
        r["settings"]["tasks"] = [c["task"] for c in cells]
        r.update(judge(r["cells"], r["max_drop"], r["min_float_score"]))
        parts.append(r)
    return upgrade_tasks_result(whole), parts


def test_merging_split_runs_gives_the_whole_runs_cells_and_decision():
    whole, parts = _parts()
    merged = merge_tasks_results(parts, ["a.json", "b.json"])
    assert validate_tasks_result(merged) == []
    assert merged["cells"] == whole["cells"]
    assert merged["settings"] == whole["settings"]
    assert (merged["gates"], merged["decision"]) == (whole["gates"], whole["decision"])
    assert merged["status"] == "complete" and merged["failures"] == []
    assert [m["source"] for m in merged["provenance"]["merged_from"]] == ["a.json", "b.json"]
    assert merged["provenance"]["merged_from"][1]["cells"] == ["niah_multikey_1@512", "vt@512"]
    assert merged["provenance"]["wall_s"] == pytest.approx(2 * whole["provenance"]["wall_s"])


def test_a_stopped_part_makes_the_merge_failed_with_its_failure_named():
    _, parts = _parts()
    parts[1]["status"] = "failed"
    parts[1]["failures"] = [{"stage": "run", "type": "Terminated", "message": "terminated by signal 15"}]
    merged = merge_tasks_results(parts, ["a.json", "b.json"])
    assert merged["status"] == "failed" and validate_tasks_result(merged) == []
    assert merged["failures"] == [{**parts[1]["failures"][0], "source": "b.json"}]
    parts[1].update(status="running", failures=[])  # killed: nothing recorded by the run itself
    assert (
        merge_tasks_results(parts, ["a.json", "b.json"])["failures"][0]["message"] == "b.json did not finish"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["settings"].update(n=4), "b.json has n 4, a.json 8"),
        (lambda r: r["model"].update(name="smollm2-135m"), "b.json measured model name 'smollm2-135m'"),
        (lambda r: r["cells"].append(copy.deepcopy(r["cells"][0]) | {"task": "niah_single_1"}),
         "niah_single_1 @ 512 is measured in both a.json and b.json"),
    ],
)  # fmt: skip
def test_runs_that_do_not_belong_together_are_refused(edit, message):
    _, parts = _parts()
    edit(parts[1])
    with pytest.raises(ValueError, match="merge|measured|has n") as err:
        merge_tasks_results(parts, ["a.json", "b.json"])
    assert message in str(err.value)
    with pytest.raises(ValueError, match="merge needs two result files or more, got 1: a.json"):
        merge_tasks_results(parts[:1], ["a.json"])  # it said "got 1 and 1"


def test_the_command_merges_files_and_refuses_bad_use(tmp_path, capsys):
    _, parts = _parts()
    files = []
    for i, r in enumerate(parts):
        files.append(str(tmp_path / f"p{i}.json"))
        Path(files[-1]).write_text(json.dumps(r))
    out = tmp_path / "m.json"
    assert main(["tasks", "--merge", *files, "--out", str(out), "--figure", str(tmp_path / "m.png")]) == 0
    assert (
        validate_tasks_result(json.loads(out.read_text())) == [] and (tmp_path / "m.png").stat().st_size > 0
    )
    assert "vt" in capsys.readouterr().out
    for argv, message in (
        (["--merge", *files], "--merge needs --out"),
        (["--merge", *files, "--out", str(out)], "already exists"),
        (
            ["--merge", *files, "--out", str(tmp_path / "x.json"), "--n", "3"],
            "--merge measures nothing; drop --n",
        ),
        (["--merge", files[0], str(tmp_path / "none.json"), "--out", str(tmp_path / "y.json")], "none.json"),
        # one file said "got 1 and 1"
        (["--merge", files[0], "--out", str(tmp_path / "z.json")], f"--merge needs two result files or more, got one: {files[0]}"),
    ):
        assert main(["tasks", *argv]) == 2
        assert message in capsys.readouterr().err


def test_markdown_tables_read_every_entry_from_the_cells():
    whole, _ = _parts()
    text = markdown_tables(whole)
    lines = text.strip().splitlines()
    names = list(whole["cells"][0]["caches"])
    assert lines[0] == "| 512 tokens | " + " | ".join(names) + " |"
    assert len(lines) == 3 + len(whole["cells"])
    row = whole["cells"][1]["caches"]["kivi-2"]
    lo, hi = row["ci95"]
    gate = next(
        g["status"] for g in whole["gates"] if g["task"] == "niah_multikey_1" and g["cache"] == "kivi-2"
    )
    entry = f"{row['score']:.2f} · {row['correct']}/{row['trials']} ({lo:.2f}-{hi:.2f})"
    assert entry in lines[4] and lines[4].startswith("| niah_multikey_1 |")
    assert ("**fail**" if gate == "fail" else gate if gate == "pass" else "n.i.") in lines[4]
    assert lines[2].split(" | ")[1:3] == [
        "1.00",
        f"{whole['cells'][0]['caches'][names[1]]['cache_bytes_ratio']:.2f}",
    ]


def test_runs_with_other_candidates_merge_each_cell_with_its_own_caches():
    _, parts = _parts()
    for cell in parts[1]["cells"]:
        del cell["caches"]["kivi-2"]
    parts[1]["settings"]["candidates"].remove("kivi-2")
    merged = merge_tasks_results(parts, ["a.json", "b.json"])
    assert validate_tasks_result(merged) == []
    assert merged["settings"]["candidates"] == parts[0]["settings"]["candidates"]
    kivi2 = merged["decision"]["kivi-2"]
    assert (
        kivi2["passed"] + kivi2["not_informative"] + len(kivi2["failed"]) == 1
    )  # judged on the first cell only
    lines = markdown_tables(merged).strip().splitlines()
    column = lines[0].split(" | ").index("kivi-2")
    assert [line.split(" | ")[column] for line in lines[4:]] == ["-", "-"]  # not measured in the second file


def test_the_committed_real_model_merge_holds_its_parts_cells():
    merged = json.loads((EXAMPLE.parent / "tasks-smollm2-2026-12-03.json").read_text())
    assert validate_tasks_result(merged) == []
    root = EXAMPLE.parents[2]
    parts = [json.loads((root / m["source"]).read_text()) for m in merged["provenance"]["merged_from"]]
    assert merged["cells"] == [c for p in parts for c in p["cells"]]
    assert (merged["gates"], merged["decision"]) == tuple(
        judge(merged["cells"], merged["max_drop"], merged["min_float_score"])[k]
        for k in ("gates", "decision")
    )


def test_the_merge_refuses_a_file_given_twice_and_an_out_that_is_one_of_its_inputs(tmp_path, capsys):
    """``--out`` naming a ``--merge`` file, with --force, replaced that part with the whole (kvlab report refuses
    its own input as --html); a part given twice was "niah_single_1 @ 512 is measured in both F and F"."""
    _, parts = _parts()
    files = []
    for i, r in enumerate(parts):
        files.append(tmp_path / f"p{i}.json")
        files[-1].write_text(json.dumps(r))
    before = files[0].read_bytes()
    argv = ["tasks", "--merge", *map(str, files), "--out", str(files[0]), "--force"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--out {files[0]} is one of the --merge files" in err and len(err.splitlines()) == 1, err
    assert files[0].read_bytes() == before
    again = str(tmp_path / "." / "p1.json")  # the same file, spelt otherwise
    assert main(["tasks", "--merge", *map(str, files), again, "--out", str(tmp_path / "m.json")]) == 2
    assert f"--merge {again} is given twice" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
