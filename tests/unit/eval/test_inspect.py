"""``kvlab inspect``'s computation (:mod:`kvlab.eval.inspect`) on a tiny model, its statistics on planted tensors,
the eval candidates it pairs with (fp8-*, kivi-kKvV), and the command's bad input."""

import json

import pytest
import torch

from kvlab.eval.inspect import _channels, inspect_kv
from kvlab.quant.fp8 import calibrate, encode


def test_channel_statistic_finds_a_planted_outlier_channel():
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))  # [tokens, head_dim]
    x[:, 7] *= 20.0
    stats = _channels(x, 4.0)
    assert stats["outlier_channels"] == 1 and stats["top_channel"] == 7
    assert stats["channel_ratio"] > 10
    assert _channels(torch.randn(256, 64), 4.0)["outlier_channels"] == 0


@pytest.fixture(scope="module")
def report(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    return inspect_kv(tiny_qwen2, ids, calibrate_tokens=20)


def test_report_covers_every_layer_and_head_with_numbers_from_the_tensors(tiny_qwen2, report):
    cfg = tiny_qwen2.config
    assert len(report["layers"]) == cfg.num_hidden_layers
    assert all(len(layer["heads"]) == cfg.num_key_value_heads for layer in report["layers"])
    head = report["layers"][1]["heads"][0]
    assert head["key"]["p50"] <= head["key"]["p99"] <= head["key"]["p99.9"] <= head["key"]["absmax"]
    # recompute one FP8 cell by hand: layer 1, head 0, e4m3 with per-head scales from the first 20 tokens
    from transformers import DynamicCache

    from kvlab.runtime.hf_api import cache_kwarg

    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    cache = DynamicCache()
    with torch.no_grad():
        tiny_qwen2(ids, use_cache=True, **{cache_kwarg(tiny_qwen2): cache})
    k = cache.layers[1].keys.float()
    assert head["key"]["absmax"] == pytest.approx(float(k[0, 0].abs().max()))
    scale = calibrate(k[:, :, :20], "e4m3", "per-head")[0, 0]
    enc = encode(k[0, 0], "e4m3", scale)
    cell = head["fp8"]["e4m3"]["per-head"]
    v = cache.layers[1].values.float()
    venc = encode(v[0, 0], "e4m3", calibrate(v[:, :, :20], "e4m3", "per-head")[0, 0])
    n = k[0, 0].numel()
    assert cell["saturated_fraction"] == pytest.approx((int(enc.saturated) + int(venc.saturated)) / (2 * n))
    assert cell["underflow_fraction"] == pytest.approx((int(enc.underflow) + int(venc.underflow)) / (2 * n))
    json.dumps(report)  # JSON-ready


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"outlier_factor": 1.0}, "`outlier_factor` must be a number > 1, got 1.0"),
        ({"percentiles": (50, 100)}, r"percentiles must be numbers in \(0, 100\), got \[50, 100\]"),
        ({"calibrate_tokens": 0}, r"`calibrate_tokens` must be an int in \[1, 40\], got 0"),
    ],
)
def test_bad_settings_are_named(tiny_qwen2, kwargs, match):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=match):
        inspect_kv(tiny_qwen2, ids, **kwargs)
    with pytest.raises(ValueError, match=r"`input_ids` must be \[1, tokens\], got \(2, 40\)"):
        inspect_kv(tiny_qwen2, ids.repeat(2, 1))


def test_eval_candidates_take_fp8_formats_and_asymmetric_kivi():
    from kvlab.eval.candidates import Candidate, check_candidate_names

    check_candidate_names(("dynamic", "fp8-e4m3", "fp8-e5m2-unscaled", "kivi-k8v4"))
    assert Candidate.parse("fp8-e4m3").family == "fp8"
    with pytest.raises(ValueError, match="write cache candidate 'kivi-k4v4' as 'kivi-4'"):
        check_candidate_names(("dynamic", "kivi-k4v4"))
    with pytest.raises(ValueError, match="reads keys and values at one width; use kivi-k8v4"):
        Candidate.parse("kivi-k8v4-fused")
    with pytest.raises(ValueError, match="`fp8` needs a variant"):
        Candidate.parse("fp8")


def test_command_refuses_bad_flags_and_existing_files(tmp_path, capsys):
    from kvlab.cli import main

    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["inspect", "--json", str(out)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main(["inspect", "--outlier-factor", "0.5"]) == 2
    assert "--outlier-factor must be a finite number > 1, got 0.5" in capsys.readouterr().err
    assert main(["inspect", "--figure", str(tmp_path / "nope" / "f.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_runs_asymmetric_kivi_on_the_dequantize_path_in_a_fused_run():
    """The fused path reads keys and values at one width: kivi-k8v4 takes the dequantize path by itself (the whole
    run was refused), and says so in its description."""
    from kvlab.eval.config import EvalConfig
    from kvlab.eval.runner import new_result

    cfg = EvalConfig(candidates=("dynamic", "kivi-4", "kivi-k8v4"))
    assert cfg.kivi_attention == "fused"
    attention = {c["name"]: c.get("attention") for c in new_result(cfg, "x", None)["candidates"]}
    assert attention == {"dynamic": None, "kivi-4": "fused", "kivi-k8v4": "dequantize"}


@pytest.mark.parametrize(
    "name, group", [("kivi-4", 32), ("kivi-k8v4", 32), ("fp8-e4m3", None), ("hqq-4", 64)]
)
def test_eval_rows_record_the_group_size_the_cache_uses(name, group):
    """An FP8 row has no group size (it was recorded as HQQ's 64); KIVI rows carry G, HQQ rows their own."""
    from kvlab.eval.candidates import Candidate
    from kvlab.eval.config import EvalConfig
    from tests.unit.eval.test_gates_and_decision import BASE, BASE_TOPK, measurement
    from tests.unit.eval.test_gates_and_decision import row_of as _row

    meas = measurement(2.0, BASE_TOPK, 100.0, 500, [[1, 2, 3, 4], [5, 6, 7, 8]])
    cfg = EvalConfig(top_k=2, hqq_group_size=64, kivi_attention="dequantize")
    row = _row("capacity", Candidate.parse(name), 16, 4, 128, 32, meas, BASE, cfg)
    assert row["group_size"] == group


def test_attention_kl_is_measured_per_head_and_the_attention_is_switched_back(tiny_qwen2, report):
    """The queries come from the same prefill through kvlab attention's observers; the model runs its own attention
    again afterwards (inspect must not leave a user's model switched)."""
    assert tiny_qwen2.config._attn_implementation != "kvlab"
    kl = report["fp8_key_attention_kl"]
    assert kl["measured"] and report["settings"]["attention_queries"] == 20  # min(64, 40 tokens // 2)
    cells = [h["fp8_key_attention_kl"] for layer in report["layers"] for h in layer["heads"]]
    assert len(cells) == 4  # 2 layers x 2 KV heads
    for fmt in ("e4m3", "e5m2"):
        for variant in ("per-head", "hadamard"):
            values = [c[fmt][variant] for c in cells]
            assert all(v >= 0 for v in values) and max(values) > 0  # FP8 moves the attention, a little
            assert kl[fmt][variant]["mean"] == pytest.approx(sum(values) / len(values))
    # e5m2 (2 mantissa bits) moves it more than e4m3 (3) on average
    assert kl["e5m2"]["per-head"]["mean"] > kl["e4m3"]["per-head"]["mean"]


def test_attention_kl_of_planted_keys_shows_what_the_rotation_buys():
    """Scores carried by one outlier key channel: plain e4m3 moves them by its relative error of that channel; the
    rotated keys spread it over 64 channels. The exact attention is recomputed here: the KL is against it."""
    from kvlab.eval.inspect import _key_attention_kl

    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, 1, 200, 64, generator=g)
    k[..., 7] = 12.0 + torch.randn(1, 1, 200, generator=g)  # [1, H, T, D]
    q = torch.randn(2, 8, 64, generator=g)  # 2 query heads share the KV head, last 8 queries
    q[..., 7] = 4.0
    (cells,) = _key_attention_kl(q, 0.125, k, calibrate_tokens=100)
    assert cells["e4m3"]["hadamard"] < 0.5 * cells["e4m3"]["per-head"], cells
    assert cells["e5m2"]["hadamard"] < 0.5 * cells["e5m2"]["per-head"], cells
    assert cells["e4m3"]["per-head"] > 1e-4  # not a zero by construction
    odd = _key_attention_kl(q[..., :48], 0.125, k[..., :48], calibrate_tokens=100)[0]
    assert odd["e4m3"]["hadamard"] is None and odd["e4m3"]["per-head"] > 0  # head_dim 48: no rotation


def test_a_model_that_cannot_run_kvlab_attention_gets_the_rest_of_the_report(tiny_qwen2, monkeypatch):
    from kvlab.attention import interface

    def refuse(model):
        raise ValueError("this model has no attention interface")

    monkeypatch.setattr(interface, "enable", refuse)
    ids = torch.randint(1, 256, (1, 30), generator=torch.Generator().manual_seed(6))
    r = inspect_kv(tiny_qwen2, ids)
    assert r["fp8_key_attention_kl"] == {
        "measured": False,
        "note": "kvlab attention could not be enabled on this model (ValueError: this model has no attention "
        "interface)",
    }
    assert r["fp8"]["e4m3"]["per-head"]["saturated_fraction"] >= 0  # ranges and FP8 fractions are still there
    assert not any("fp8_key_attention_kl" in h for layer in r["layers"] for h in layer["heads"])


def test_attention_kl_of_a_2_token_prompt_is_not_measured_rather_than_zero(tiny_qwen2):
    # the breakit pass saw a table of 0.00e+00: the last query attends to one key, a KL of 0 by construction
    report = inspect_kv(tiny_qwen2, torch.tensor([[5, 7]]), calibrate_tokens=1)
    kl = report["fp8_key_attention_kl"]
    assert kl["measured"] is False and "2 tokens" in kl["note"] and "at least 3" in kl["note"]
    assert report["settings"]["attention_queries"] == 0
    assert not any("fp8_key_attention_kl" in h for layer in report["layers"] for h in layer["heads"])
    three = inspect_kv(tiny_qwen2, torch.tensor([[5, 7, 9]]), calibrate_tokens=1)
    assert three["fp8_key_attention_kl"]["measured"]
