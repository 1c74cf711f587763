"""MixedCache: per-layer formats from a plan; bytes equal the torch-free planner's; each uniform plan reproduces the
cache of its family bit for bit; crop, reset and beam search as the other caches; bad plans refused by name."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches.fp8 import FP8Cache
from kvlab.caches.kivi import KIVICache
from kvlab.caches.mixed import MixedCache
from kvlab.plan.load import load_spec
from kvlab.plan.mixed import plan_kv_bytes, plan_layer_bytes
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2, random_prompt

G = R = 32
ALL = {  # one layer of each kind, K and V apart
    "layers": {
        "0": {"k": "float", "v": "float"},
        "1": {"k": "fp8-e4m3", "v": "fp8-e4m3"},
        "2": {"k": "kivi-8", "v": "kivi-2"},
        "3": {"k": "kivi-4", "v": "kivi-4"},
    }
}


@pytest.fixture(scope="module")
def model():
    return make_tiny_qwen2(head_dim=32, max_positions=512, layers=4)


def _generate(model, prompt, cache, new=6, **kw):
    out = model.generate(
        prompt,
        **{cache_kwarg(model): cache},
        max_new_tokens=new,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **kw,
    )
    return out.sequences, torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [5, 32, 70, 100])
def test_bytes_equal_the_planner_per_layer(tokens, dtype):
    model = make_tiny_qwen2(head_dim=32, max_positions=512, dtype=dtype, layers=4)
    cache = MixedCache(ALL, model.config, group_size=G, residual_length=R)
    with torch.no_grad():
        model(random_prompt(2, tokens), use_cache=True, **{cache_kwarg(model): cache})
        model(random_prompt(2, 1, seed=1), use_cache=True, **{cache_kwarg(model): cache})  # one decode step
    spec = load_spec({**model.config.to_dict(), "torch_dtype": str(dtype).removeprefix("torch.")})
    want = plan_layer_bytes(spec, cache.formats, tokens + 1, batch=2, group_size=G, residual_length=R)
    assert cache.nbytes_layers() == want
    assert cache.nbytes() == plan_kv_bytes(
        spec, cache.formats, tokens + 1, 2, group_size=G, residual_length=R
    )
    assert len(set(want)) == (4 if tokens + 1 >= R + G else 2)  # once KIVI quantizes, the four layers differ


@pytest.mark.parametrize(
    ("fmt", "reference"),
    [
        ("float", lambda: DynamicCache()),
        ("fp8-e4m3", lambda: FP8Cache(attention="dequantize")),
        ("kivi-4", lambda: KIVICache(nbits=4, group_size=G, residual_length=R)),
        ("kivi-2", lambda: KIVICache(nbits=2, group_size=G, residual_length=R)),
    ],
)
def test_a_uniform_plan_is_the_cache_of_its_family(model, fmt, reference):
    prompt = random_prompt(2, 70)
    plan = {"layers": {"*": {"k": fmt, "v": fmt}}}
    tokens, logits = _generate(model, prompt, MixedCache(plan, model.config, group_size=G, residual_length=R))
    ref_tokens, ref_logits = _generate(model, prompt, reference())
    assert torch.equal(tokens, ref_tokens) and torch.equal(logits, ref_logits)


def test_keys_and_values_take_their_own_kivi_bits(model):
    prompt = random_prompt(1, 70)
    plan = {"layers": {"*": {"k": "kivi-8", "v": "kivi-4"}}}
    mixed = _generate(model, prompt, MixedCache(plan, model.config, group_size=G, residual_length=R))
    ref = _generate(model, prompt, KIVICache(key_bits=8, value_bits=4, group_size=G, residual_length=R))
    assert torch.equal(mixed[1], ref[1])


def test_crop_reset_and_beam_search(model):
    prompt = random_prompt(2, 70)
    spec = load_spec({**model.config.to_dict(), "torch_dtype": "float32"})
    cache = MixedCache(ALL, model.config, group_size=G, residual_length=R)
    with torch.no_grad():
        model(prompt, use_cache=True, **{cache_kwarg(model): cache})
    cache.crop(-6)  # inside KIVI's residual window (Q = 32 of 70): every layer keeps 64, as if it got 64
    assert [layer.get_seq_length() for layer in cache.layers] == [64] * 4
    assert cache.nbytes() == plan_kv_bytes(spec, cache.formats, 64, 2, group_size=G, residual_length=R)
    cache.crop(20)  # a positive n keeps the first n (transformers' max_length): into KIVI's quantized prefix
    assert [layer.get_seq_length() for layer in cache.layers] == [20] * 4
    with pytest.raises(TypeError, match="integer"):
        cache.crop(1.5)
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.nbytes() == 0
    # beam search: reorder_cache / batch_repeat_interleave on every layer kind; a float plan equals DynamicCache
    float_plan = {"layers": {"*": {"k": "float", "v": "float"}}}
    beams = {"num_beams": 3, "num_return_sequences": 1}
    got = _generate(model, prompt, MixedCache(float_plan, model.config), **beams)
    assert torch.equal(got[0], _generate(model, prompt, DynamicCache(), **beams)[0])
    seqs, _ = _generate(
        model, prompt, MixedCache(ALL, model.config, group_size=G, residual_length=R), **beams
    )
    assert seqs.shape == (2, 76)


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        (
            {"4": {"k": "float", "v": "float"}, "*": {"k": "float", "v": "float"}},
            "layer 4, which the model lacks: it has 4",
        ),
        ({"*": {"k": "kivi-3", "v": "kivi-4"}}, "unknown KV format 'kivi-3'"),
        ({"*": {"k": "fp8-e4m3", "v": "kivi-4"}}, "keys 'fp8-e4m3' with values 'kivi-4'"),
        ({"0": {"k": "float", "v": "float"}}, "no formats for layer 1"),
        ({"x": {"k": "float", "v": "float"}}, "'x' is not a layer index"),
        ({"*": {"k": "float"}}, r"expected \{\"k\": format"),
    ],
)
def test_bad_plans_are_refused_in_one_line_naming_the_value(model, layers, match):
    with pytest.raises(ValueError, match=match) as err:
        MixedCache({"layers": layers}, model.config)
    assert "\n" not in str(err.value)


def test_named_plans_come_from_the_plan_folder(tmp_path):
    """``mixed-<name>`` reads ``$KVLAB_PLAN_DIR/<name>.json`` (the registry lists it at import); an unknown name is
    refused with the known ones."""
    (tmp_path / "two-k8.json").write_text(json.dumps({"layers": {"*": {"k": "kivi-8", "v": "kivi-2"}}}))
    (tmp_path / "Not_A_Name.json").write_text("{}")
    code = (
        "from kvlab.caches.registry import cache_names, resolve\n"
        "names = [n for n in cache_names('mixed')]\n"
        "assert names == ['mixed-demo', 'mixed-two-k8'], names\n"
        "d = resolve('mixed-two-k8').describe()\n"
        "assert d['layers'] == {'*': {'k': 'kivi-8', 'v': 'kivi-2'}} and d['plan_source'].endswith('two-k8.json'), d\n"
        "try:\n"
        "    resolve('mixed-nope')\n"
        "except ValueError as e:\n"
        "    assert 'got \\'nope\\'' in str(e) and 'two-k8' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('mixed-nope resolved')\n"
    )
    env = {"KVLAB_PLAN_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize("tokens", [40, 100])
def test_cache_bytes_equal_what_kvlab_plan_reports(tmp_path, monkeypatch, capsys, tokens):
    """``MixedCache.nbytes()`` after a prefill of ``tokens`` x 2 rows equals ``kvlab plan CONFIG --kv-dtype
    mixed-<plan> --context tokens --batch 2``'s total, layer by layer, with the plan read from ``$KVLAB_PLAN_DIR``
    as ``kvlab eval`` reads it."""
    from kvlab.cli import main

    model = make_tiny_qwen2(head_dim=32, max_positions=512, dtype=torch.bfloat16, layers=4)
    (tmp_path / "config.json").write_text(json.dumps({**model.config.to_dict(), "torch_dtype": "bfloat16"}))
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "four.json").write_text(json.dumps(ALL))
    monkeypatch.setenv("KVLAB_PLAN_DIR", str(tmp_path / "plans"))
    cache = MixedCache(ALL, model.config, group_size=G, residual_length=R)
    with torch.no_grad():
        model(random_prompt(2, tokens), use_cache=True, **{cache_kwarg(model): cache})
    argv = ["plan", str(tmp_path / "config.json"), "--kv-dtype", "mixed-four", "--context", str(tokens)]
    argv += ["--batch", "2", "--group-size", str(G), "--residual", str(R), "--weight-bytes", "1000", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_bytes_per_layer_per_gpu"] == cache.nbytes_layers()
    assert report["kv_bytes_total"] == cache.nbytes() > 0
    assert [(row["k"], row["v"]) for row in report["plan_layers"]] == cache.formats
