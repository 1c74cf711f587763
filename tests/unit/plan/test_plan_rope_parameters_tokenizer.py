"""``kvlab plan`` derives a model's context limit from its checkpoint folder as vLLM's ``_get_and_verify_max_len``
(``vllm/config/model.py``) does: the RoPE scaling from transformers 5's ``rope_parameters`` (flat or one set per
layer type) as well as transformers 4's ``rope_scaling``, and the ``model_max_length`` of the
``tokenizer_config.json`` beside ``config.json``, which vLLM takes only for a pooling model with absolute position
embeddings (for a generative model it is noted, not taken); transformers' "no limit" sentinel (1e30) is no limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan import presets
from kvlab.plan.load import load_config, load_spec
from kvlab.plan.vllm import vllm_max_model_len

SENTINEL = 1000000000000000019884624838656  # int(1e30), as transformers writes "no limit"


def _folder(tmp_path: Path, tokenizer: dict | str | None = None, **fields) -> Path:
    """A model folder: llama-3-8b's config (no rope_scaling) with ``fields``, and ``tokenizer`` as its
    tokenizer_config.json (an object, or the file's text) where given."""
    config = {k: v for k, v in presets.find("llama-3-8b").config.items() if k != "rope_scaling"}
    config.update(fields)
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if tokenizer is not None:
        text = tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer)
        (folder / "tokenizer_config.json").write_text(text, encoding="utf-8")
    return folder


def _plan(capsys, *argv: str) -> tuple[dict, str]:
    assert main(["plan", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _limits(folder: Path) -> tuple[int, int]:
    spec = load_spec(str(folder))
    return spec.context_limit, vllm_max_model_len(spec, load_config(str(folder)))


@pytest.mark.parametrize(
    ("rope", "positions", "limit"),
    [
        ({"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}, 4096, 16384),
        ({"rope_type": "dynamic", "factor": 2.0}, 4096, 8192),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}, 32768, 32768),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}, 8192, 32768),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 131072, 131072),
        ({"rope_type": "longrope", "factor": 32.0}, 131072, 131072),
        ({"rope_type": "default", "rope_theta": 500000.0}, 8192, 8192),  # transformers 5 writes it for every model
    ],
)
def test_rope_parameters_scale_the_limit_as_rope_scaling_does(rope, positions, limit, tmp_path):
    new = _limits(_folder(tmp_path, max_position_embeddings=positions, rope_parameters=rope))
    legacy = {("type" if k == "rope_type" else k): v for k, v in rope.items()}  # transformers 4 spelled it `type`
    old = _limits(_folder(tmp_path / "old", max_position_embeddings=positions, rope_scaling=legacy))
    assert new == old == (limit, limit)


def test_rope_scaling_is_taken_over_rope_parameters_where_both_are_stated(tmp_path):
    """transformers 5 (`rope_scaling or rope_parameters`) and vLLM on transformers 4 read rope_scaling first."""
    folder = _folder(
        tmp_path,
        max_position_embeddings=4096,
        rope_scaling={"type": "linear", "factor": 2.0},
        rope_parameters={"rope_type": "linear", "factor": 8.0},
    )
    assert _limits(folder) == (8192, 8192)
    assert load_spec(str(folder)).rope_field == "rope_scaling"


def test_per_layer_type_rope_parameters_are_read_and_the_set_used_is_named(tmp_path, capsys):
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
    }
    folder = _folder(tmp_path, max_position_embeddings=8192, rope_parameters=rope)
    assert _limits(folder) == (32768, 32768)
    r, err = _plan(capsys, str(folder), "--context", "40000")
    assert r["spec"]["context_limit"] == 32768
    said = [n for n in r["notes"] if "rope_parameters.full_attention" in n]
    assert said and "32,768" in said[0] and "sliding_attention" in said[0], r["notes"]
    assert "rope_parameters.full_attention" in r["warnings"][0] and "32,768" in r["warnings"][0], r["warnings"]


def test_per_layer_type_sets_that_do_not_scale_leave_the_limit(tmp_path, capsys):
    rope = {
        "full_attention": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024},
        "sliding_attention": {"rope_type": "default"},
    }
    folder = _folder(tmp_path, max_position_embeddings=4096, rope_parameters=rope)
    assert _limits(folder) == (4096, 4096)
    r, _ = _plan(capsys, str(folder))
    said = "max_position_embeddings, its llama3 rope_parameters.full_attention included (no --context given"
    assert any(said in n for n in r["notes"]), r["notes"]


def test_a_gemma3s_per_layer_rope_parameters_do_not_scale_its_limit(tmp_path):
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}
    folder = _folder(tmp_path, model_type="gemma3_text", max_position_embeddings=131072, rope_parameters=rope)
    assert _limits(folder) == (131072, 131072)


@pytest.mark.parametrize("factor", [float("inf"), float("nan"), 0, -2, "4"])
def test_a_bad_factor_in_rope_parameters_is_refused_naming_the_field_and_file(factor, tmp_path, capsys):
    rope = {"full_attention": {"rope_type": "linear", "factor": factor}, "sliding_attention": {"rope_type": "default"}}
    folder = _folder(tmp_path, rope_parameters=rope)
    assert main(["plan", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "`rope_parameters.full_attention.factor`" in err and str(folder / "config.json") in err, err
    assert "Traceback" not in err


def test_a_generative_models_lower_tokenizer_length_is_noted_not_taken(tmp_path, capsys):
    """vLLM passes tokenizer_config only for pooling models with absolute position embeddings: a Llama whose
    tokenizer says 4,096 is served at its config's 8,192."""
    folder = _folder(tmp_path, max_position_embeddings=8192, tokenizer={"model_max_length": 4096})
    assert _limits(folder) == (8192, 8192)
    for model in (folder, folder / "config.json"):  # the folder, or its config.json: the same folder for vLLM
        r, _ = _plan(capsys, str(model))
        assert r["context"] == 8192
        said = [n for n in r["notes"] if "tokenizer_config.json's model_max_length" in n]
        assert said and "4,096" in said[0] and "does not cap" in said[0] and "--context 4096" in said[0], r["notes"]


@pytest.mark.parametrize("length", [SENTINEL, 1e30, float("inf"), 10**20, 8192, 100000, None])
def test_a_tokenizer_length_at_or_above_the_limit_or_no_limit_changes_nothing(length, tmp_path, capsys):
    folder = _folder(tmp_path, max_position_embeddings=8192, tokenizer={"model_max_length": length})
    r, _ = _plan(capsys, str(folder))
    assert r["spec"]["context_limit"] == 8192
    assert not any("model_max_length" in n for n in r["notes"]), r["notes"]


def _pooling_folder(tmp_path: Path, tokenizer: dict, **fields) -> Path:
    """BAAI/bge-reranker-base's shape: an XLM-RoBERTa of 514 absolute positions, a tokenizer of 512."""
    config = {
        "architectures": ["XLMRobertaForSequenceClassification"], "model_type": "xlm-roberta",
        "position_embedding_type": "absolute", "hidden_size": 768, "num_attention_heads": 12,
        "num_hidden_layers": 12, "intermediate_size": 3072, "max_position_embeddings": 514, "vocab_size": 250002,
        "torch_dtype": "float32",
    }  # fmt: skip
    config.update(fields)
    folder = tmp_path / "reranker"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return folder


def test_a_pooling_model_with_absolute_positions_is_capped_by_its_tokenizer(tmp_path, capsys):
    folder = _pooling_folder(tmp_path, {"model_max_length": 512})
    assert _limits(folder) == (512, 512)
    r, _ = _plan(capsys, str(folder))
    assert r["context"] == 512
    said = [n for n in r["notes"] if "vLLM caps a pooling model" in n]
    assert said and "tokenizer_config.json's model_max_length" in said[0], r["notes"]
    assert "512" in said[0] and "max_position_embeddings 514" in said[0], r["notes"]
    assert any("model_max_length of tokenizer_config.json (no --context given" in n for n in r["notes"]), r["notes"]


@pytest.mark.parametrize(
    "fields",
    [
        {"position_embedding_type": "rotary"},  # not absolute
        {"architectures": ["XLMRobertaForCausalLM"]},  # generative
        {"architectures": ["GPT2LMHeadModel"]},  # an LM head, not a "...Model" pooler
    ],
)
def test_the_tokenizer_caps_only_vllms_pooling_models_with_absolute_positions(fields, tmp_path):
    folder = _pooling_folder(tmp_path, {"model_max_length": 512}, **fields)
    assert _limits(folder) == (514, 514)


def test_a_pooling_model_stating_no_position_field_takes_its_tokenizers_length(tmp_path):
    """vLLM's min(inf, model_max_length): the tokenizer's 8,192, not the 2,048 assumed for a config stating none."""
    folder = _pooling_folder(tmp_path, {"model_max_length": 8192}, max_position_embeddings=None)
    assert _limits(folder) == (8192, 8192)


@pytest.mark.parametrize("length", [SENTINEL, 1e30, 10**20])
def test_transformers_no_limit_sentinel_is_no_limit_even_where_no_position_field_is_stated(length, tmp_path):
    """vLLM would take min(inf, 1e30): a max_model_len of 10^30 tokens; the sentinel means "no limit", so the
    limit is the 2,048 vLLM assumes for a config stating none."""
    folder = _pooling_folder(tmp_path, {"model_max_length": length}, max_position_embeddings=None)
    assert _limits(folder) == (2048, 2048)


@pytest.mark.parametrize("length", ["512", True, float("nan"), 0, -1, 512.5])
def test_a_tokenizer_length_that_is_not_a_whole_number_is_refused_naming_the_file(length, tmp_path, capsys):
    folder = _folder(tmp_path, tokenizer={"model_max_length": length})
    assert main(["plan", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "`model_max_length`" in err and str(folder / "tokenizer_config.json") in err, err
    assert "must be a whole number >= 1" in err and "Traceback" not in err


@pytest.mark.parametrize("text", ["{not json", "[512]"])
def test_a_tokenizer_config_that_is_not_a_json_object_is_refused_naming_it(text, tmp_path, capsys):
    folder = _folder(tmp_path, tokenizer=text)
    assert main(["plan", str(folder)]) == 2
    err = capsys.readouterr().err
    assert str(folder / "tokenizer_config.json") in err and "Traceback" not in err, err


def test_a_config_file_not_named_config_json_reads_no_tokenizer_beside_it(tmp_path, capsys):
    folder = _folder(tmp_path, max_position_embeddings=8192, tokenizer={"model_max_length": "bad"})
    other = folder / "llama.json"
    other.write_text((folder / "config.json").read_text(), encoding="utf-8")
    r, _ = _plan(capsys, str(other))
    assert r["spec"]["context_limit"] == 8192
