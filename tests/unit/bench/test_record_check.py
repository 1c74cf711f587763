"""Records that ``kvlab bench docs`` cannot render faithfully are refused where they are read, naming file and field."""

import json
import shutil
from pathlib import Path

import pytest

from kvlab.bench import docs, record_check, results
from kvlab.cli import main

COMMITTED = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
LEAVES = {record_check.COUNT: 1, record_check.AMOUNT: 1.0, record_check.DIVISOR: 1.0, record_check.TEXT: "x", bool: True}


def _example(spec, optional: bool):
    """A value of ``spec``: its required fields only, or (``optional``) every field it describes too."""
    if isinstance(spec, record_check.Maybe):
        return _example(spec.spec, optional) if optional else None
    if isinstance(spec, record_check.OneOf):
        return _example(spec.specs[0], optional)
    if isinstance(spec, list):
        return [_example(spec[0], optional)] * 2
    if isinstance(spec, record_check.Each):
        return {"a": _example(spec.spec, optional)}
    if isinstance(spec, record_check.Rows):
        common = _example(spec.common, optional)
        return [common | _example(spec.ok, optional) | {"status": "ok"}, common | {"status": "failed"}]
    if isinstance(spec, dict):
        return {k.rstrip("?"): _example(v, optional) for k, v in spec.items() if optional or not k.endswith("?")}
    return LEAVES[spec]


@pytest.mark.parametrize("optional", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", results.BENCHMARKS)
def test_every_record_the_check_accepts_renders_and_is_judged(kind, device, optional):
    """The description names every field the page and the verdicts read: a record holding only those renders."""
    result = _example(record_check.SPECS[kind], optional)
    if "device_type" in result:
        result["device_type"] = device
    record = {"format": results.FORMAT, "benchmark": kind, "command": "c", "quick": False, "result": result}
    record_check.check_record("f.json", record)
    assert f"## `{kind}`" in docs.render_page([(Path(f"{kind}.json"), record)])


def _damaged(tmp_path, name, change):
    folder = tmp_path / "results"
    folder.mkdir()
    record = json.loads((COMMITTED / name).read_text(encoding="utf-8"))
    change(record)
    (folder / name).write_text(json.dumps(record))
    return folder


def _docs(capsys, folder):
    code = main(["bench", "docs", "--results-dir", str(folder), "--out", str(folder.parent / "P.md")])
    return code, capsys.readouterr().err


def _set(path, value):
    def change(record):
        *head, last = path
        target = record
        for key in head:
            target = target[key]
        target[last] = value

    return change


def _drop(path):
    def change(record):
        *head, last = path
        target = record
        for key in head:
            target = target[key]
        del target[last]

    return change


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("decode-cpu.json", _drop(["result", "rows"]), "not a complete decode record: missing result.rows"),
        ("kernel-cpu.json", _set(["result"], {}), "not a complete kernel record: missing result.device_type"),
        ("flush-cpu.json", _set(["result"], {}), "not a complete flush record: missing result.shape"),
        ("memory-cpu.json", _set(["result"], {}), "not a complete memory record: missing result.method"),
        ("lab-cpu.json", _set(["result"], {}), "not a complete lab record: missing result.config"),
        ("lab-cpu.json", _set(["machine"], "x"), "not a valid lab record: machine is 'x', expected an object"),
        ("paging-cpu.json", _set(["benchmark"], "decode"), "not a complete decode record: missing result."),
        ("lab-cpu.json", _set(["quick"], "no"), "not a valid lab record: quick is 'no', expected true or false"),
        (
            "paging-cpu.json",
            _set(["result", "static", "admit_s"], -1.0),
            "not a valid paging record: result.static.admit_s is -1.0, expected a finite number >= 0",
        ),
        (
            "paging-cpu.json",
            _set(["result", "static", "admit_s"], float("nan")),
            "not a valid paging record: result.static.admit_s is nan, expected a finite number >= 0",
        ),
        (
            "memory-cpu.json",
            _set(["result", "rows", 0, "cache_bytes"], -5),
            "result.rows[0].cache_bytes is -5, expected a finite number >= 0",
        ),
        (
            "flush-cpu.json",
            _set(["result", "rows", 0, "flush_us"], 0.0),
            "result.rows[0].flush_us is 0.0, expected a finite number > 0",
        ),
        ("flush-cpu.json", _set(["result", "rows", 0, "flush_us_all", 0], float("inf")), "flush_us_all[0] is inf"),
    ],
)
def test_a_damaged_record_is_refused_naming_file_and_field(tmp_path, capsys, name, change, message):
    folder = _damaged(tmp_path, name, change)
    code, err = _docs(capsys, folder)
    assert code == 2
    assert f"{folder / name} is " in err and message in err
    assert "Traceback" not in err and not (tmp_path / "P.md").exists()


def test_a_binary_file_is_named(tmp_path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(COMMITTED / "lab-cpu.json", folder)
    (folder / "x.json").write_bytes(b"\x80\x81binary")
    code, err = _docs(capsys, folder)
    assert code == 2 and f"{folder / 'x.json'} is not a JSON text file (not UTF-8" in err


def test_every_committed_record_passes():
    assert len(results.read_records(COMMITTED, include_quick=True)) == len(list(COMMITTED.glob("*.json"))) - 2
