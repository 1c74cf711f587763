"""The ``kvlab tasks`` result schema: a valid result (built by code, and both committed example runs, written as
version 1) passes; a damaged one is refused with a problem naming the field; the readers of ``kvlab figures`` and
``kvlab report`` validate a tasks file by its own schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.eval.io import read_result, read_results
from kvlab.eval.tasks_schema import validate_tasks_result
from tests.unit.figures.conftest import synthetic_tasks_result

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def test_valid_results_pass():
    assert validate_tasks_result(synthetic_tasks_result()) == []
    assert validate_tasks_result(synthetic_tasks_result("running")) == []


@pytest.mark.parametrize("name", ["tasks-bundled-512-2026-12-02.json", "tasks-smollm2-2048-2026-12-02.json"])
def test_version_1_files_still_read(name):
    result = read_result(EXAMPLES / name, tasks=True)
    assert result["version"] == 1 and "status" not in result and result["cells"]


@pytest.mark.parametrize(
    "name, version",
    [("tasks-bundled-512-2026-12-02.json", 1), ("tasks-smollm2-2048-2026-12-03.json", 2)],
)
def test_old_files_read_with_the_ratio_in_kvlab_evals_direction(name, version):
    """Versions 1 and 2 wrote ``bytes_ratio`` = float bytes / cache bytes, the inverse of kvlab eval's × dyn
    (``cache_bytes_ratio``, cache bytes / dynamic's): they are read with eval's field, recomputed from the bytes
    the row holds; a version-2 file becomes version 3 (a resumed run writes it whole), a version-1 file keeps its
    number (its other fields are version 1's)."""
    raw = json.loads((EXAMPLES / name).read_text())
    assert raw["version"] == version and validate_tasks_result(raw) == []
    result = read_result(EXAMPLES / name, tasks=True)
    assert result["version"] == (1 if version == 1 else 3)
    for old, new in zip(raw["cells"], result["cells"]):
        for cache, row in new["caches"].items():
            was = old["caches"][cache]["bytes_ratio"]
            assert "bytes_ratio" not in row and row["cache_bytes_ratio"] == pytest.approx(1 / was)
            assert row["cache_bytes_ratio"] == row["bytes"] / row["float_bytes"]
    if version == 2:
        assert validate_tasks_result(result) == []
    # a version-3 file with the old field, or without the new one, is refused naming it
    damaged = synthetic_tasks_result()
    damaged["cells"][0]["caches"]["kivi-4"]["bytes_ratio"] = damaged["cells"][0]["caches"]["kivi-4"].pop(
        "cache_bytes_ratio"
    )
    assert "cells[0].caches[\"kivi-4\"]: lacks 'cache_bytes_ratio'" in validate_tasks_result(damaged)


def test_tasks_and_eval_print_the_bytes_in_one_direction_under_one_label(capsys):
    """kvlab tasks printed "bytes ratio" = dynamic / cache (2.81 for kivi-4), kvlab eval "× dyn" = cache / dynamic
    (0.36): one idea in opposite directions. Both say × dyn, cache bytes over the float cache's."""
    from kvlab.cli import main
    from kvlab.eval.render import COLUMN_LEGEND as EVAL_LEGEND
    from kvlab.eval.tasks_render import COLUMN_LEGEND, COLUMNS, markdown_tables, table_rows

    assert "× dyn = cache bytes / dynamic's" in " ".join(EVAL_LEGEND.split())
    assert "× dyn" in COLUMNS and "columns: × dyn = cache bytes / dynamic's" in COLUMN_LEGEND
    result = read_result(EXAMPLES / "tasks-smollm2-2048-2026-12-03.json", tasks=True)
    rows = {(r[0], r[2]): r[3] for r in table_rows(result)}
    assert rows[("niah_single_1", "kivi-4")] == "0.36" and rows[("niah_single_1", "dynamic")] == "1.00"
    assert "| × dyn | 1.00 | 0.36 | 0.24 | 0.50 |" in markdown_tables(result)
    assert main(["report", str(EXAMPLES / "tasks-smollm2-2048-2026-12-03.json")]) == 0
    out = capsys.readouterr().out
    assert "× dyn" in out and "bytes ratio" not in out and "0.36" in out and "2.81" not in out


def _set(path: str, value):
    def damage(result: dict) -> None:
        *keys, last = path.split("/")
        node = result
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value

    return damage


@pytest.mark.parametrize(
    "damage, field",
    [
        (_set("kind", "kvlab-bench"), "kind"),
        (_set("version", 9), "version"),
        (_set("status", "done"), "status"),
        (_set("cells", KeyError), "missing field 'cells'"),
        (_set("cells/0/caches/kivi-2/score", 1.5), 'cells[0].caches["kivi-2"].score'),
        (_set("cells/0/caches/kivi-2/cache_bytes_ratio", float("nan")), 'cells[0].caches["kivi-2"].cache_bytes_ratio'),
        (_set("cells/0/caches/kivi-4/correct", 5), 'cells[0].caches["kivi-4"].correct'),
        (_set("cells/1/caches/kivi-4/ci95", [0.9, 0.1]), 'cells[1].caches["kivi-4"].ci95'),
        (_set("cells/1/caches/dynamic", KeyError), "cells[1].caches: lacks the float row"),
        (_set("cells/0/context", "512"), "cells[0].context"),
        (_set("cells/0/caches/kivi-2/answers/0/output", None), 'cells[0].caches["kivi-2"].answers[0].output'),
        (_set("gates/0/status", "maybe"), "gates[0].status"),
        (_set("decision/kivi-4/verdict", "fine"), 'decision["kivi-4"].verdict'),
        (_set("failures", [{"stage": "run", "type": "KeyboardInterrupt"}]), "failures[0]: lacks 'message'"),
        (_set("settings/n", 0), "settings.n"),
        (_set("cells/0/caches/kivi-4/ci95", None), 'cells[0].caches["kivi-4"].ci95: must be a [low, high] pair'),
        (_set("candidates/kivi-4", None), 'candidates["kivi-4"]: must be an object'),
        (_set("candidates/kivi-4/line", 3), 'candidates["kivi-4"].line: must be a string'),
    ],
)
def test_a_damaged_result_is_refused_naming_the_field(damage, field):
    result = synthetic_tasks_result()
    damage(result)
    problems = validate_tasks_result(result)
    assert problems and any(field in p for p in problems), problems


def test_a_failed_result_names_its_failure():
    result = synthetic_tasks_result("failed")
    assert any("failures" in p for p in validate_tasks_result(result))
    result["failures"] = [{"stage": "run", "type": "KeyboardInterrupt", "message": "interrupted by the user"}]
    assert validate_tasks_result(result) == []


def test_readers_validate_a_tasks_file(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(synthetic_tasks_result()))
    damaged = synthetic_tasks_result()
    damaged["cells"][0]["caches"]["kivi-4"]["score"] = -1
    bad.write_text(json.dumps(damaged))
    assert read_results([good]) == (None, read_result(good, tasks=True))
    with pytest.raises(
        ValueError, match=r"bad.json is not a valid kvlab tasks result: .*\"kivi-4\"\]\.score"
    ):
        read_result(bad, tasks=True)
    with pytest.raises(ValueError, match="is a kvlab tasks result, not a kvlab eval result"):
        read_result(good)
    other = good.with_name("other.json")
    other.write_text(good.read_text())
    with pytest.raises(ValueError, match="both kvlab tasks results"):
        read_results([good, other])
    with pytest.raises(ValueError, match="good.json is given twice"):
        read_results([good, good])


@pytest.mark.parametrize(
    "damage",
    [_set("cells/0/caches/kivi-4/ci95", None), _set("candidates/kivi-4", "x"), _set("candidates/kivi-4/line", [])],
)
def test_kvlab_report_refuses_a_damaged_row_or_candidate_in_one_line(tmp_path, capsys, damage):
    """A row whose interval is null (the table unpacked it: TypeError), a candidate that is not an object or whose
    figure line is not a name (the HTML page and its figure: AttributeError, TypeError) are refused on reading,
    naming the field, not met as a traceback by the text report or --html."""
    from kvlab.cli import main

    result = synthetic_tasks_result()
    damage(result)
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(result))
    for extra in ([], ["--html", str(tmp_path / "page.html")]):
        assert main(["report", str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert "is not a valid kvlab tasks result" in err and "kivi-4" in err and "Traceback" not in err


def test_kvlab_report_html_draws_a_result_whose_min_float_score_is_null(tmp_path):
    """The schema reads a null threshold as "not stored" (no gate is judged again); the figure of the HTML report
    compared each float score with it (TypeError: '>=' between float and NoneType) and now uses the default, as
    for an absent one."""
    from kvlab.cli import main

    result = synthetic_tasks_result()
    result["min_float_score"] = None
    path, page = tmp_path / "tasks.json", tmp_path / "page.html"
    path.write_text(json.dumps(result))
    assert main(["report", str(path), "--html", str(page)]) == 0 and page.stat().st_size > 0


def test_a_stale_decision_whose_verdict_stands_names_the_field_that_does_not():
    """A decision kept from a larger run (its ``failed`` lists a cell the file no longer holds) was refused as
    'decision["kivi-2"].verdict: "rejected" does not follow from the cells (...; judged again over them:
    "rejected")', a line that contradicts itself; it names the field that differs."""
    result = synthetic_tasks_result()
    result["decision"]["kivi-2"]["failed"] = [*result["decision"]["kivi-2"]["failed"], "vt@99999"]
    problems = validate_tasks_result(result)
    assert len(problems) == 1 and problems[0].startswith('decision["kivi-2"].failed: '), problems
    assert "vt@99999" in problems[0] and ".verdict" not in problems[0]
