"""docs/PERFORMANCE.md's integer-path part: read from the kvlab eval results kept in docs/examples that hold a
``summary.integer_path``, nothing typed by hand; a folder without such results changes nothing."""

from __future__ import annotations

import json

from kvlab.bench import docs, docs_eval


def _eval(share, met, status):
    row = {
        "context_length": 2048, "candidate": "kivi-4:dot=int8", "twin": "kivi-4", "kl_mean": 0.0004 * share / 0.1,
        "own_kl_mean": 0.004, "share_of_own_kl": share, "key_score_path": "int8 (avx2)", "met": met,
    }  # fmt: skip
    return {
        "command": ["kvlab", "eval", "--model", "smollm2-135m"],
        "provenance": {
            "hardware": {"device": "cpu", "torch_threads": 1},
            "model": {"id_or_path": "smollm2-135m"},
        },
        "summary": {"integer_path": {"target": "KL <= 10%", "status": status, "rows": [row]}},
    }


def test_a_kept_eval_result_gives_a_target_and_a_table(tmp_path):
    ex = tmp_path / "docs" / "examples"
    ex.mkdir(parents=True)
    (ex / "eval-a.json").write_text(json.dumps(_eval(0.05, True, "met")))
    (ex / "eval-b.json").write_text(json.dumps({"summary": {"decision": "accept"}}))  # no twin: not read
    (ex / "eval-c.json").write_text("not json")
    records = docs_eval.eval_records(docs_eval.examples_dir(tmp_path / "benchmarks" / "results"))
    assert [p.name for p, _ in records] == ["eval-a.json"]
    (t,) = docs_eval.integer_path_targets(records)
    assert t["status"] == "met" and t["detail"] == "5.0% at 2048 (int8 (avx2))" and t["file"] == "eval-a.json"
    page = docs.render_page([], "benchmarks/results", records)
    assert "## Integer KIVI path: accuracy by `kvlab eval`" in page and "| 2048 | `kivi-4:dot=int8` |" in page
    assert "**met**" in page


def test_a_not_met_share_is_rendered_not_met(tmp_path):
    (t,) = docs_eval.integer_path_targets([(tmp_path / "eval-x.json", _eval(0.4, False, "not met"))])
    assert t["status"] == "not met" and t["detail"].startswith("40.0% at 2048")


def test_no_examples_folder_renders_the_page_as_before(tmp_path):
    assert docs_eval.eval_records(tmp_path / "nowhere") == []
    assert docs.render_page([], "benchmarks/results", []) == docs.render_page([], "benchmarks/results")
    assert "Integer KIVI path" not in docs.render_page([], "benchmarks/results")


def test_the_float_kernel_row_of_the_run_is_named_as_its_rounding_floor(tmp_path):
    result = _eval(0.3, False, "not met")
    result["rows"] = [
        {"matrix": "capacity", "context_length": 2048, "candidate": "dynamic-ckernel", "kl_mean": 0.0017},
        {"matrix": "capacity", "context_length": 2048, "candidate": "kivi-4:dot=int8", "kl_mean": 0.0041},
    ]
    text = "\n".join(docs_eval.render_integer_path([(tmp_path / "eval-x.json", result)], docs._table))
    assert "`dynamic-ckernel` (the float cache" in text and "is at KL 0.0017 at 2048" in text
    assert "| 0.004 | 0.0041 | 30.0% |" in text  # the int8 row's own KL, read from its row
    assert "Rounding floor" not in "\n".join(
        docs_eval.render_integer_path([(tmp_path / "eval-y.json", _eval(0.3, False, "not met"))], docs._table)
    )


def test_a_recorded_window_residuals_empty_is_shown_as_none(tmp_path):
    """The kept int8-twin results ran with ``--window-residuals ''``, which the CLI now refuses (``none`` is the
    word): the page printed that command as the one that produced them, so it failed as printed. It is shown as
    ``none`` now, with a note, and the result file's command is left as it ran."""
    result = _eval(0.3, False, "not met")
    result["command"] += ["--window-residuals", "", "--label", "x"]
    text = "\n".join(docs_eval.render_integer_path([(tmp_path / "eval-x.json", result)], docs._table))
    assert "--window-residuals none --label x` (the result records `--window-residuals ''`; `none` is the" in text
    assert result["command"][-3] == ""
    assert docs_eval.current_command(["kvlab", "eval", "--window-residuals="]) == (
        ["kvlab", "eval", "--window-residuals=none"],
        ["the result records `--window-residuals ''`; `none` is the current spelling"],
    )
    assert docs_eval.current_command(["kvlab", "eval", "--window-residuals"]) == (
        ["kvlab", "eval", "--window-residuals"],
        [],
    )


def test_every_kept_eval_command_on_the_page_parses_as_printed():
    """Each ``Command:`` docs/PERFORMANCE.md prints for a kept kvlab eval result is one the CLI takes now."""
    import shlex
    from pathlib import Path

    from kvlab.cli import build_parser

    root = Path(__file__).resolve().parents[3]
    records = docs_eval.eval_records(root / "docs" / "examples")
    assert records
    parser = build_parser()
    for _, result in records:
        command, _ = docs_eval.current_command(result["command"])
        page_line = f"Command: `{shlex.join(command)}`"
        assert page_line in (root / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
        args = parser.parse_args(command[1:])  # exits 2 on a value the CLI refuses
        assert args.window_residuals == tuple(result["settings"]["window_residuals"])
