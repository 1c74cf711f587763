"""What a new user read around the decision of ``kvlab eval``: a decision at contexts past the model's trained
positions printed with no caveat (``decision: accept kivi-4 at context 16384``), a run of the baseline alone
printed ``None`` and ``decision: tune_cache_policy``, and "(see the failures)" where there were none."""

from __future__ import annotations

import io
import json

from rich.console import Console

from kvlab.cli import main
from kvlab.eval.decision import summarize
from kvlab.eval.decision_words import no_candidate_advice
from kvlab.eval.render import print_summary

BUNDLED_LIMIT = 8192  # the bundled reference model's max_position_embeddings (its config.json)


def _row(candidate: str, context: int, eligible: bool, new_tokens: int = 16) -> dict:
    base = candidate == "dynamic"
    row = {
        "matrix": "capacity",
        "candidate": candidate,
        "context_length": context,
        "new_tokens": new_tokens,
        "cache_bytes": 1000 if base else 330,
        "cache_bytes_saved": 0 if base else 670,
        "ms_per_token": 1.0,
    }
    if not base:
        gates = {"nll_delta": eligible, "topk_overlap": True, "latency_ratio": True, "saves_memory": True}
        row.update(cache_bytes_ratio=0.33, latency_ratio=1.0, nll_delta=0.01, topk_overlap=0.97, gates=gates)
        row["eligible"] = eligible
    return row


def _result(rows: list[dict], limit: int | None, failures: list | None = None) -> dict:
    result = {
        "label": "t",
        "status": "complete",
        "provenance": {"model": {"id_or_path": "m", "max_position_embeddings": limit}},
        "gates": {"max_nll_delta": 0.05, "min_topk_overlap": 0.9, "max_latency_ratio": 1.5},
        "candidates": [{"name": "dynamic"}, {"name": "kivi-4"}],
        "rows": rows,
        "failures": failures or [],
    }
    result["summary"] = summarize(result)
    return result


def _text(result: dict) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None, record=True)
    print_summary(result, console)
    return console.export_text()


def test_a_decision_past_the_trained_positions_carries_the_caveat():
    rows = [_row("dynamic", 16384, False), _row("kivi-4", 16384, True)]
    result = _result(rows, BUNDLED_LIMIT)
    assert result["summary"]["decision"] == "accept kivi-4 at context 16384"  # the rows are judged, not dropped
    warning = result["summary"]["positions_warning"]
    assert "16,384" in warning and f"max_position_embeddings ({BUNDLED_LIMIT:,})" in warning
    line = next(li for li in _text(result).splitlines() if li.startswith("decision:"))
    assert "accept kivi-4 at context 16384" in line and "caveat" in line and "trained positions" in line
    assert f"warning: {warning}" in " ".join(_text(result).split())


def test_prompt_plus_new_tokens_past_the_limit_counts_and_within_it_no_caveat():
    within = _result([_row("dynamic", 8176, False), _row("kivi-4", 8176, True)], BUNDLED_LIMIT)
    assert within["summary"]["positions_warning"] is None
    assert "caveat" not in _text(within)
    past = _result([_row("dynamic", 8177, False), _row("kivi-4", 8177, True)], BUNDLED_LIMIT)
    assert "8,177" in past["summary"]["positions_warning"]
    # a result without the limit (written before the field, or a config stating none): no claim either way
    assert _result([_row("kivi-4", 99999, True)], None)["summary"]["positions_warning"] is None


def test_a_context_past_the_positions_is_refused_unless_allowed(tmp_path, capsys, monkeypatch):
    """Past the model's max_position_embeddings (read from its config, no model loaded): refused before any work,
    naming the flag, the cell length, the longest context that fits and --allow-past-limit; with the flag a dry run
    warns instead, and the setting is recorded."""
    import kvlab.models

    def no_load(*args, **kwargs):
        raise AssertionError("nothing is loaded")

    monkeypatch.setattr(kvlab.models, "load_model", no_load)
    argv = ["eval", "--contexts", "100000", "--out-dir", str(tmp_path), "--label", "d"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "kvlab eval: error: --contexts 100000 + 64 new tokens = 100,064 tokens pass the model's" in err
    assert f"max_position_embeddings ({BUNDLED_LIMIT:,})" in err and "not trained on" in err
    assert f"pass --contexts {BUNDLED_LIMIT - 64} or less, or --allow-past-limit to measure them anyway" in err
    assert not (tmp_path / "d.json").exists()
    assert main([*argv, "--window-context", "9000", "--dry-run"]) == 2  # both flags named
    err = " ".join(capsys.readouterr().err.split())
    assert "; --window-context 9,000 + 128 new tokens = 9,128" in err and "--window-context 8064 or less" in err
    assert main([*argv, "--dry-run", "--allow-past-limit"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning:" in err and "100,064" in err and f"max_position_embeddings ({BUNDLED_LIMIT:,})" in err
    assert json.loads((tmp_path / "d.json").read_text())["settings"]["allow_past_limit"] is True
    assert main(["eval", "--contexts", "512", "--dry-run", "--out-dir", str(tmp_path), "--label", "e"]) == 0
    assert "max_position_embeddings" not in capsys.readouterr().err


def test_the_default_and_quick_matrices_fit_the_bundled_model():
    """The README's `kvlab eval` (the bundled model, default contexts) and --quick are not refused."""
    from kvlab.eval.config import EvalConfig, quick_config
    from kvlab.eval.model_info import context_limit_problem

    for cfg in (EvalConfig(), quick_config()):
        assert context_limit_problem(cfg, BUNDLED_LIMIT) is None
    assert context_limit_problem(EvalConfig(contexts=(8192,)), BUNDLED_LIMIT) is not None  # 8,192 + 64 does not


def test_the_loaded_models_limit_refuses_too(tmp_path, capsys, monkeypatch, tiny_qwen2):
    """A model whose files state no limit before loading (a hub id) is checked once loaded: refused, exit 2, and
    recorded as a settings failure; --allow-past-limit lets it run with the caveat."""
    from tests.unit.eval.test_eval_unit import CharTokenizer

    monkeypatch.setattr("kvlab.commands.eval.run.configured_limit", lambda model: None)
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (tiny_qwen2, CharTokenizer()))
    limit = tiny_qwen2.config.max_position_embeddings
    argv = ["eval", "--candidates", "dynamic,kivi-8", "--contexts", str(limit), "--window-residuals", "none",
            "--no-long-context", "--prompt-mode", "repeat", "--device", "cpu", "--dtype", "float32",
            "--out-dir", str(tmp_path), "--label", "h"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--contexts {limit} + 64 new tokens" in err and "--allow-past-limit" in err
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["status"] == "failed" and result["failures"][0]["stage"] == "settings"


def test_describe_model_records_the_position_limit(tiny_qwen2):
    from kvlab.eval.model_info import describe_model

    info = describe_model(tiny_qwen2, None, "float32", "cpu")
    assert info["max_position_embeddings"] == tiny_qwen2.config.max_position_embeddings


def test_the_baseline_alone_is_refused_before_any_work(tmp_path, capsys):
    assert main(["eval", "--candidates", "dynamic", "--out-dir", str(tmp_path), "--label", "b"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--candidates" in err and "nothing to compare: give at least one candidate besides dynamic" in err
    assert not (tmp_path / "b.json").exists()


def test_no_eligible_row_is_worded_without_none_or_the_file_token():
    result = _result([_row("dynamic", 512, False), _row("kivi-4", 512, False)], BUNDLED_LIMIT)
    assert result["summary"]["decision"] == "tune_cache_policy"  # the file keeps its token
    text = " ".join(_text(result).split())
    text = text[text.index("memory-reduction onset") :]  # the decision's lines (this sketch records no software)
    assert "None" not in text and "tune_cache_policy" not in text
    assert "decision: none: keep DynamicCache (no candidate passed every gate)" in text
    assert "eligible crossover (first context passing every gate): none (no context passed every gate)" in text
    assert "(see the failures)" not in text  # the result has none


def test_see_the_failures_only_where_there_are_failures():
    failure = {"candidate": "kivi-4", "context_length": 512, "stage": "generate", "type": "E", "message": "m"}
    failed = _result([_row("dynamic", 512, False)], BUNDLED_LIMIT, [failure])
    assert "(see the failures)" in no_candidate_advice(failed)
    quiet = _result([_row("dynamic", 512, False)], BUNDLED_LIMIT)
    assert "see the failures" not in no_candidate_advice(quiet)
    json.dumps(quiet)  # the summary stays JSON


def test_a_package_the_run_lacked_is_said_not_none():
    """A run without the optional hqq package printed "hqq None" in the summary's header."""
    result = _result([_row("dynamic", 512, False), _row("kivi-4", 512, True)], BUNDLED_LIMIT)
    result["provenance"]["software"] = {"torch": "2.13.0", "transformers": "5.25.0", "hqq": None}
    text = " ".join(_text(result).split())
    assert "torch 2.13.0, transformers 5.25.0, hqq not installed" in text and "hqq None" not in text
