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
        (_set("cells/0/caches/kivi-2/bytes_ratio", float("nan")), 'cells[0].caches["kivi-2"].bytes_ratio'),
        (_set("cells/0/caches/kivi-4/correct", 5), 'cells[0].caches["kivi-4"].correct'),
        (_set("cells/1/caches/kivi-4/ci95", [0.9, 0.1]), 'cells[1].caches["kivi-4"].ci95'),
        (_set("cells/1/caches/dynamic", KeyError), "cells[1].caches: lacks the float row"),
        (_set("cells/0/context", "512"), "cells[0].context"),
        (_set("cells/0/caches/kivi-2/answers/0/output", None), 'cells[0].caches["kivi-2"].answers[0].output'),
        (_set("gates/0/status", "maybe"), "gates[0].status"),
        (_set("decision/kivi-4/verdict", "fine"), 'decision["kivi-4"].verdict'),
        (_set("failures", [{"stage": "run", "type": "KeyboardInterrupt"}]), "failures[0]: lacks 'message'"),
        (_set("settings/n", 0), "settings.n"),
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
