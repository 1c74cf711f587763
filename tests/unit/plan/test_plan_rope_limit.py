"""``kvlab plan`` on a config with ``rope_scaling``: a factor that is not a finite number > 0 is refused naming the
field and the file, and the model's context limit is the one vLLM derives with the scaling
(:func:`kvlab.plan.vllm.vllm_max_model_len`), for the default context and the warning alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan import presets
from kvlab.plan.spec import spec_from_config


def _model_dir(tmp_path: Path, rope_scaling: dict, positions: int = 4096) -> Path:
    """A model directory: llama-3-8b's config with ``max_position_embeddings`` ``positions`` and ``rope_scaling``.
    The factor goes through ``json.dumps``, which writes ``Infinity`` / ``NaN`` as the JSON a user's file holds."""
    config = dict(presets.find("llama-3-8b").config, max_position_embeddings=positions, rope_scaling=rope_scaling)
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize("factor", [float("inf"), float("nan"), 0, -2, "4", True])
def test_a_rope_scaling_factor_that_is_not_a_finite_positive_number_is_refused_naming_the_file(factor, tmp_path, capsys):
    """Infinity was an OverflowError traceback, NaN "cannot convert float NaN to integer", 0 and -2 a limit of 0 and
    -8,192 tokens in --emit vllm's refusal."""
    folder = _model_dir(tmp_path, {"type": "linear", "factor": factor})
    for argv in ([str(folder), "--emit", "vllm"], [str(folder / "config.json")]):
        assert main(["plan", *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        assert "`rope_scaling.factor`" in captured.err and str(folder / "config.json") in captured.err, captured.err
        assert f"must be a finite number > 0, got {factor!r}" in captured.err, captured.err


def test_spec_from_config_refuses_such_a_factor_naming_the_model():
    config = dict(presets.find("llama-3-8b").config, rope_scaling={"type": "dynamic", "factor": float("inf")})
    with pytest.raises(ValueError, match=r"`rope_scaling.factor` of my-model must be a finite number > 0, got inf"):
        spec_from_config(config, name="my-model")


def _plan(capsys, *argv: str) -> tuple[dict, str]:
    assert main(["plan", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


@pytest.mark.parametrize("kind", ["linear", "dynamic"])
def test_the_default_context_goes_by_the_rope_scaled_limit_vllm_derives(kind, tmp_path, capsys):
    """4,096 positions with factor 4: the default context was 4,096 ("kvlab's default 8,192 is beyond the model's
    limit") while --emit vllm's own check put the limit at 16,384."""
    from kvlab.plan.load import load_config, load_spec
    from kvlab.plan.vllm import vllm_max_model_len

    folder = _model_dir(tmp_path, {"type": kind, "factor": 4.0})
    derived = vllm_max_model_len(load_spec(str(folder)), load_config(str(folder)))
    assert derived == 4 * 4096
    r, err = _plan(capsys, str(folder), "--emit", "vllm")
    assert r["spec"]["context_limit"] == derived
    assert r["context"] == r["vllm"]["max_model_len"] == min(derived, 8192)
    assert not any("beyond the model's limit" in n for n in r["notes"]), r["notes"]
    assert "warning" not in err and r["warnings"] == []


@pytest.mark.parametrize("kind", ["linear", "dynamic"])
def test_a_context_within_the_rope_scaled_limit_is_not_warned_about(kind, tmp_path, capsys):
    """--context 8192 warned "beyond max_position_embeddings 4,096 ... without RoPE scaling" though the config
    scales it to 16,384; beyond 16,384 the warning names that limit and the scaling."""
    folder = _model_dir(tmp_path, {"type": kind, "factor": 4.0})
    r, err = _plan(capsys, str(folder), "--context", "8192", "--emit", "vllm")
    assert r["warnings"] == [] and "warning" not in err
    r, err = _plan(capsys, str(folder), "--context", str(4 * 4096 + 1))
    assert len(r["warnings"]) == 1 and "warning" in err
    said = r["warnings"][0]
    assert f"{4 * 4096:,}" in said and "rope_scaling" in said and "without RoPE scaling" not in said, said


def test_without_rope_scaling_the_limit_is_still_max_position_embeddings(tmp_path, capsys):
    folder = _model_dir(tmp_path, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024})
    r, _ = _plan(capsys, str(folder))  # llama3 states the scaled length itself: vLLM does not multiply
    assert r["spec"]["context_limit"] == r["spec"]["max_position_embeddings"] == r["context"] == 4096
    said = "max_position_embeddings, its llama3 rope_scaling included (no --context given"
    assert any(said in n for n in r["notes"]), r["notes"]
