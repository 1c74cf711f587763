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
