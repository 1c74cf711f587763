"""The model's context limit as vLLM derives it (``_get_and_verify_max_len``, ``vllm/config/model.py``): the
smallest of the position fields a config states (kvlab took the first: ``max_position_embeddings`` 4,096 beside
``seq_length`` 2,048 was 4,096, which vLLM refuses), ``model_max_length`` over them, 2,048 where the config states
none (kvlab checked nothing), no RoPE factor on a Gemma 3; the notes and refusals name the field the limit came
from, and a context beyond a limit that already includes the config's RoPE scaling (Kimi's yarn) is no longer
warned about "without RoPE scaling"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan import presets
from kvlab.plan.spec import spec_from_config
from kvlab.plan.vllm import vllm_max_model_len

LLAMA = presets.find("llama-3-8b").config  # max_position_embeddings 8,192


def _config(**fields) -> dict:
    """llama-3-8b's config with ``fields`` set (None: the field removed)."""
    config = dict(LLAMA, **fields)
    return {k: v for k, v in config.items() if v is not None}


def _limits(config: dict) -> tuple[int | None, str | None, int | None]:
    """``(spec.max_position_embeddings, spec.position_field, vllm_max_model_len)``."""
    spec = spec_from_config(config, name="m")
    return spec.max_position_embeddings, spec.position_field, vllm_max_model_len(spec, config)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"seq_length": 2048}, (2048, "seq_length", 2048)),  # the smallest, not the first
        ({"max_position_embeddings": 1024, "n_positions": 4096}, (1024, "max_position_embeddings", 1024)),
        ({"max_position_embeddings": None, "n_positions": 1024, "seq_len": 512}, (512, "seq_len", 512)),
        ({"n_positions": 8192}, (8192, "max_position_embeddings", 8192)),  # equal: the first in vLLM's order
        ({"model_max_length": 131072}, (131072, "model_max_length", 131072)),  # Command-R's, over the others
        ({"max_seq_len": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, (4096, "max_seq_len", 8192)),
    ],
)
def test_the_limit_is_the_smallest_position_field_as_vllm_takes_it(fields, expected):
    assert _limits(_config(**fields)) == expected


def test_a_config_without_a_position_field_gets_vllms_2048():
    """vLLM assumes 2,048 (and scales it by the RoPE factor); kvlab had no limit to check --emit vllm against."""
    assert _limits(_config(max_position_embeddings=None)) == (None, None, 2048)
    scaled = _config(max_position_embeddings=None, rope_scaling={"type": "linear", "factor": 4.0})
    assert _limits(scaled) == (None, None, 8192)


def test_gemma3s_rope_factor_is_not_applied_again():
    """vLLM: "Gemma3's max_model_len (128K) is already scaled by RoPE scaling"."""
    gemma = dict(presets.find("gemma-3-1b").config, max_position_embeddings=131072)
    gemma["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    assert _limits(gemma) == (131072, "max_position_embeddings", 131072)
    assert spec_from_config(gemma).context_limit == 131072


def test_a_bad_second_position_field_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"config field `seq_length` must be an integer, got 'long'"):
        spec_from_config(_config(seq_length="long"))


def _plan(tmp_path: Path, capsys, config: dict, *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code = main(["plan", str(path), *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_notes_and_refusals_name_the_field_the_limit_came_from(tmp_path, capsys):
    config = _config(seq_length=2048)
    code, out, err = _plan(tmp_path, capsys, config, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["context"] == 2048
    assert any("context 2,048 tokens" in n and "seq_length" in n for n in r["notes"]), r["notes"]
    code, _, err = _plan(tmp_path, capsys, config, "--context", "4096", "--emit", "vllm")
    assert code == 2 and "limit of 2,048 tokens (seq_length)" in err, err
    code, out, err = _plan(tmp_path, capsys, config, "--context", "4096", "--json")
    assert code == 0
    assert "beyond" in err and "seq_length 2,048" in json.loads(out)["warnings"][0]


def test_emit_vllm_refuses_a_context_beyond_vllms_default_naming_it(tmp_path, capsys):
    config = _config(max_position_embeddings=None)
    code, _, err = _plan(tmp_path, capsys, config, "--context", "4096", "--emit", "vllm")
    assert code == 2 and "limit of 2,048 tokens (limit as vLLM sets it for a config stating no position field (2,048))" in err and "no position field" in err, err
    code, out, err = _plan(tmp_path, capsys, config, "--context", "2048", "--emit", "vllm", "--json")
    assert code == 0, err
    assert json.loads(out)["vllm"]["max_model_len"] == 2048


def test_without_a_position_field_the_default_context_is_vllms_2048(tmp_path, capsys):
    """The default context was kvlab's 8,192, and --emit vllm's --max-model-len 8192, which vLLM refuses."""
    code, out, err = _plan(tmp_path, capsys, _config(max_position_embeddings=None), "--emit", "vllm", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["context"] == r["spec"]["context_limit"] == r["vllm"]["max_model_len"] == 2048
    assert r["spec"]["max_position_embeddings"] is None
    assert any("context 2,048 tokens" in n and "as vLLM sets it for a config stating no position field (2,048)" in n for n in r["notes"]), r["notes"]


def test_a_limit_that_includes_yarn_scaling_is_not_warned_about_without_rope_scaling(tmp_path, capsys):
    """Kimi-K2: yarn factor 64 on 4,096 original positions is its max_position_embeddings 262,144. The warning
    said the model "may not serve that many tokens without RoPE scaling", which the config already has."""
    yarn = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096}
    config = _config(max_position_embeddings=262144, rope_scaling=yarn)
    assert _limits(config) == (262144, "max_position_embeddings", 262144)
    code, out, err = _plan(tmp_path, capsys, config, "--context", "300000", "--json")
    assert code == 0
    (warning,) = json.loads(out)["warnings"]
    assert "262,144" in warning and "yarn rope_scaling included" in warning, warning
    assert "without RoPE scaling" not in warning and "without RoPE scaling" not in err
    plain = _config(max_position_embeddings=262144)  # no scaling stated: the advice stays
    code, out, _ = _plan(tmp_path, capsys, plain, "--context", "300000", "--json")
    assert "without RoPE scaling" in json.loads(out)["warnings"][0]


def test_a_config_with_no_position_field_is_named_in_plain_words(tmp_path, capsys):
    """The note read "nolimit.json's vLLM's default 2,048, the config stating no position field"."""
    import json as _json

    from kvlab.cli import main

    path = tmp_path / "nolimit.json"
    path.write_text(_json.dumps(dict(model_type="llama", hidden_size=512, num_attention_heads=8, num_hidden_layers=4,
                                     num_key_value_heads=2, vocab_size=1000, intermediate_size=1024)))
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"context 2,048 tokens: {path}'s limit as vLLM sets it for a config stating no position field (2,048)" in out
    assert "'s vLLM's" not in out
