"""``kvlab lab eviction`` (:mod:`kvlab.lab.eviction`): the three NLL measurements agree where they must (nothing
evicted, or a window covering the prefix), the recompute baseline is what it says, bad settings are named."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from kvlab.caches.measure import cache_nbytes
from kvlab.caches.sink import SinkCache
from kvlab.cli import main
from kvlab.lab.eviction import full_context_nll, recompute_window_nll, streaming_nll
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2


@pytest.fixture(scope="module")
def model():
    return make_tiny_qwen2(head_dim=32, max_positions=512)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 256, (80,), generator=torch.Generator().manual_seed(3))


def test_nothing_evicted_equals_the_full_context(model, ids):
    full, dynamic_nbytes = full_context_nll(model, ids)
    assert full.shape == (79,) and dynamic_nbytes == 80 * 2 * 2 * 2 * 32 * 4
    streamed, sizes = streaming_nll(model, ids, SinkCache(4, 100, config=model.config), prefill_tokens=10)
    torch.testing.assert_close(streamed, full, rtol=1e-4, atol=1e-4)
    assert sizes["nbytes"] == dynamic_nbytes  # everything held
    torch.testing.assert_close(recompute_window_nll(model, ids, window=100), full, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_chunked_scoring_equals_one_forward_of_logits():
    """The full-context NLL scored ``rows`` positions at a time (no [T, vocab] logits) is the NLL of the whole
    forward's logits, bit for bit, for chunks of several sizes and a single chunk."""
    from transformers import DynamicCache

    model = make_tiny_qwen2(head_dim=32, max_positions=512)
    ids = torch.randint(1, 256, (300,), generator=torch.Generator().manual_seed(5))
    cache = DynamicCache()
    logits = model(ids[None], **{cache_kwarg(model): cache}, use_cache=True).logits[
        0, :-1
    ]  # [299, vocab]: the unchunked path
    whole = torch.nn.functional.cross_entropy(logits.float(), ids[1:], reduction="none")
    for rows in (128, 150, 299, 1024):  # 3, 2, 1, 1 chunks
        nll, nbytes = full_context_nll(model, ids, rows=rows)
        assert torch.equal(nll, whole), rows
        assert nbytes == cache_nbytes(cache)


@torch.no_grad()
def test_recompute_window_predicts_from_the_last_w_tokens_only(model, ids):
    nll = recompute_window_nll(model, ids, window=16, batch_windows=7)
    full, _ = full_context_nll(model, ids)
    torch.testing.assert_close(nll[:16], full[:16], rtol=1e-4, atol=1e-4)  # prefix shorter than the window
    for t in (17, 40, 79):  # target t from ids[t - 16 : t] at positions 0..15
        logits = model(ids[None, t - 16 : t]).logits[0, -1]
        ref = torch.nn.functional.cross_entropy(logits[None], ids[t : t + 1])
        assert abs(float(nll[t - 1]) - float(ref)) < 1e-4, t
    assert float((nll[16:] - full[16:]).abs().max()) > 1e-3  # the window does lose context


def test_sink_cache_bytes_stay_flat_while_streaming(model, ids):
    nll, sizes = streaming_nll(model, ids, SinkCache(4, 16, config=model.config), prefill_tokens=20)
    assert nll.shape == (79,) and sizes["nbytes"] == sizes["nbytes_max"] == 20 * 2 * 2 * 2 * 32 * 4


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--window", "0"], "--window must be an int >= 1, got 0"),
        (["--sinks", "-1"], "--sinks must be an int >= 0, got -1"),
        (["--sinks", "4", "4"], "--sinks must be distinct values, got [4, 4]"),
        (
            ["--tokens", "100", "--window", "96"],
            "--tokens (100) must exceed --window + the largest of --sinks (96 + 4 = 100)",
        ),
        (["--offset", "-3"], "--offset must be an int >= 0, got -3"),
    ],
)
def test_bad_values_are_named(capsys, argv, fragment):
    assert main(["lab", "eviction", "--json", *argv]) == 2
    captured = capsys.readouterr()
    assert fragment in captured.err and captured.out == "", captured.err


def test_cli_on_the_bundled_model_reports_measured_numbers():
    from kvlab.models import reference_model_path

    if not (reference_model_path() / "model.safetensors").is_file():
        pytest.skip("the bundled reference model is not in this checkout")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["lab", "eviction", "--json", "--tokens", "120", "--window", "32", "--sinks", "2", "0"])
    r = json.loads(out.getvalue())
    assert code == (0 if r["all_passed"] else 1)
    assert [s["sink_tokens"] for s in r["sink"]] == [2, 0]
    base = r["recompute_window"]["nll_after_window"]
    for s in r["sink"]:
        assert s["nll_ratio_vs_recompute"] == pytest.approx(s["nll_after_window"] / base)
        assert s["held_tokens"] == s["sink_tokens"] + 32 and s["nbytes"] == s["nbytes_max"]
        assert s["nbytes"] < r["dynamic_nbytes"]
    assert r["evict_from_token"] == 32 + 2 + 1 and r["sink"][0]["predictions_after_window"] == 120 - 35
