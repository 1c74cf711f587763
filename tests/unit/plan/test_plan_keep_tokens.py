"""``--keep-tokens N``: the planner sizes a capped (evicting) cache. Every layer keeps ``min(its tokens, N)`` (a sliding
layer: the smaller of its window and N), stored in the KV dtype's format (KIVI: a KIVI cache of N tokens); fit,
max context and decode bound use the capped bytes. Torch-free; the ties to measured caches are in
test_plan_capped_vs_caches.py."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.plan import build_ledger, kv_bytes, kv_bytes_peak, kv_dtype, load_spec, max_batch, max_context
from kvlab.plan.ledger import tokens_stored
from kvlab.plan.report import plan_report, roofline_report
from kvlab.plan.roofline import decode_step_bound
from kvlab.plan.spec import spec_from_config

GIB = 1024**3


@pytest.fixture(scope="module")
def llama():
    return load_spec("llama-3-8b")


def sliding_128():
    """4 layers [sliding, full] x 2, window 128, bf16."""
    return spec_from_config(
        dict(
            num_hidden_layers=4,
            hidden_size=512,
            num_attention_heads=8,
            num_key_value_heads=8,
            head_dim=64,
            sliding_window=128,
            torch_dtype="bfloat16",
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
    )


@pytest.mark.parametrize("name", ["bf16", "fp8", "fp8-e4m3", "kivi-4", "kivi-k8v4", "kivi-2:group_size=64"])
@pytest.mark.parametrize("context", [1, 100, 255, 256, 257, 4096])
def test_capped_bytes_are_the_bytes_of_min_context_keep(llama, name, context):
    capped = kv_dtype(name, llama.dtype, keep_tokens=256)
    assert kv_bytes(llama, context, 3, capped) == kv_bytes(llama, min(context, 256), 3, name)


@pytest.mark.parametrize("keep", [64, 128, 200, 1000])
def test_a_sliding_layer_keeps_the_smaller_of_its_window_and_the_cap(keep):
    spec = sliding_128()
    capped = kv_dtype("bf16", spec.dtype, keep_tokens=keep)
    ledger = build_ledger(spec, 4096, 2, None, capped)
    kept = {row.kind: row.tokens_stored for row in ledger.rows}
    assert kept == {"sliding": min(128, keep), "full": min(4096, keep)}
    per_token_layer = 2 * 8 * 64 * 2  # K and V, 8 heads x 64, bf16
    expected = 2 * 2 * per_token_layer * (min(128, keep) + min(4096, keep))  # batch 2, 2 layers of each kind
    assert ledger.kv_bytes_total == kv_bytes(spec, 4096, 2, capped) == expected
    assert ledger.kv_bytes_allocated == 2 * 2 * per_token_layer * 2 * min(4096, keep)  # allocated: capped too
    assert tokens_stored(spec, "sliding", 4096) == 128  # the uncapped helper is unchanged


@pytest.mark.parametrize("keep", [100, 159, 160, 191, 300])
def test_kivi_capped_peak_is_the_brute_force_maximum(llama, keep):
    capped = kv_dtype("kivi-4", llama.dtype, keep_tokens=keep)
    brute = max(kv_bytes(llama, t, 1, capped) for t in range(0, 700))
    assert kv_bytes_peak(llama, 699, 1, capped) == brute
    assert kv_bytes_peak(llama, 699, 1, capped) == kv_bytes_peak(llama, min(699, keep), 1, "kivi-4")


def test_fit_and_decode_bound_use_the_capped_bytes(llama):
    capped = kv_dtype("bf16", llama.dtype, keep_tokens=512)
    free = 10 * GIB
    assert max_context(llama, 1, free, "bf16") == free // kv_bytes(llama, 1)  # bounded without the cap
    assert max_context(llama, 1, free, capped) is None  # 512 tokens fit: context not limited by KV
    # 1000 x 512 tokens (62.5 GiB) do not fit: the longest context is bounded below the cap again
    assert max_context(llama, 1000, free, capped) == free // (1000 * kv_bytes(llama, 1)) < 512
    assert max_batch(llama, 32768, free, capped) == free // kv_bytes(llama, 512)
    plain = decode_step_bound(llama, 32768, 4, 10**9, 2e12, kv="bf16")
    cut = decode_step_bound(llama, 32768, 4, 10**9, 2e12, 1e15, kv=capped)
    assert cut.kv_bytes == 4 * kv_bytes(llama, 512) < plain.kv_bytes == 4 * kv_bytes(llama, 32768)
    full_flops = decode_step_bound(llama, 32768, 4, 10**9, 2e12, 1e15, kv="bf16").flops_per_step
    assert cut.flops_per_step < full_flops  # attention over the kept tokens only


def test_plan_report_and_roofline_report_carry_the_cap(llama):
    r = plan_report("llama-3-8b", context=32768, batch=8, kv="kivi-4", keep_tokens=256)
    assert r["kv_dtype"]["keep_tokens"] == 256
    assert r["kv_bytes_total"] == kv_bytes(llama, 256, 8, "kivi-4")
    assert r["max_context"] is None and r["fits"] is True
    assert r["kv_bytes_read"] == r["kv_bytes_total"]
    uncapped = plan_report("llama-3-8b", context=32768, batch=8, kv="kivi-4")
    assert r["max_batch"] > uncapped["max_batch"] and uncapped["max_context"] is not None
    roof = roofline_report(model="llama-3-8b", context=32768, batch=8, kv="bf16", keep_tokens=1024)
    assert roof["kv_bytes_read"] == kv_bytes(llama, 1024, 8)


def test_cli_plan_says_the_context_is_not_limited_by_kv(capsys):
    assert (
        main(["plan", "llama-3-8b", "--context", "32768", "--kv-dtype", "kivi-4", "--keep-tokens", "256"])
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())  # a table title wraps with the terminal's width
    assert "KV kivi-4 keeping at most 256 tokens" in out
    assert "not limited by KV (the cache keeps at most 256 tokens)" in out
    assert main(["plan", "llama-3-8b", "--context", "4096", "--keep-tokens", "1024", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kv_bytes_total"] == 1024 * 131072 and r["by_layer_kind"][0]["tokens_stored"] == 1024
    assert main(["roofline", "--context", "4096", "--keep-tokens", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_read"] == 1024 * 131072


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
@pytest.mark.parametrize("value", ["0", "-3", "1.5", "abc", ""])
def test_cli_bad_keep_tokens_is_named(capsys, command, value):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--keep-tokens", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--keep-tokens" in err and f"got {value!r}" in err


@pytest.mark.parametrize("value", [0, -1, 2.5, "8", True])
def test_library_bad_keep_tokens_is_named(value):
    with pytest.raises(ValueError, match=r"keep_tokens.*--keep-tokens.*got"):
        kv_dtype("bf16", keep_tokens=value)
    with pytest.raises(ValueError, match="keep_tokens"):
        plan_report("llama-3-8b", keep_tokens=value)


def test_emit_vllm_refuses_a_cap(capsys):
    assert main(["plan", "llama-3-8b", "--keep-tokens", "256", "--emit", "vllm"]) == 2
    assert "--keep-tokens does not apply" in capsys.readouterr().err
