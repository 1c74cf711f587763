"""Real-model check: incremental decoding through each exact cache gives one full forward's logits."""

import pytest
import torch

from kvlab.lab.exactness import EXACT_CACHES, check_exact_caches, incremental_chunks


@pytest.fixture(scope="module")
def tiny_model(tiny_qwen2):
    return tiny_qwen2


@pytest.fixture(scope="module")
def exactness(tiny_model):
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(3))
    return check_exact_caches(tiny_model, ids, prefill_tokens=12)


@pytest.mark.parametrize("name", list(EXACT_CACHES))
def test_each_exact_cache_matches_full_forward(exactness, name):
    row = next(r for r in exactness["rows"] if r["cache"] == name)
    if row["status"] == "skipped":
        pytest.skip(row["error"])
    assert row["status"] == "ok", row.get("error")
    assert row["rel_err"] <= exactness["rel_tolerance"] == 1e-4
    assert row["max_abs_err"] <= row["rel_err"] * exactness["ref_scale"] * (1 + 1e-9)
    assert row["argmax_agreement"] == 1.0
    assert row["passed"] is True
    if name != "dynamic":
        assert row["max_abs_diff_vs_dynamic"] <= row["max_abs_err"] + 1e-6


def test_dynamic_cache_is_never_skipped(exactness):
    row = next(r for r in exactness["rows"] if r["cache"] == "dynamic")
    assert row["status"] == "ok"


def test_a_lossy_cache_fails_the_check(tiny_model):
    """The check can fail: a cache that drops K/V precision is reported as not exact."""
    from transformers import DynamicCache

    class Rounding(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            k = key_states.to(torch.float8_e4m3fn).float()
            v = value_states.to(torch.float8_e4m3fn).float()
            return super().update(k, v, layer_idx, *args, **kwargs)

    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(4))
    r = check_exact_caches(tiny_model, ids, caches={"fp8-rounding": lambda m, n: Rounding(config=m.config)})
    assert r["rows"][0]["status"] == "ok"
    assert r["rows"][0]["passed"] is False and r["all_passed"] is False


def test_failing_and_missing_caches_are_recorded(tiny_model):
    def broken(model, tokens):
        raise ImportError("no such cache")

    def crashing(model, tokens):
        return object()  # not a Cache: the forward raises

    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(5))
    r = check_exact_caches(tiny_model, ids, caches={"missing": broken, "crashing": crashing})
    status = {row["cache"]: row["status"] for row in r["rows"]}
    assert status == {"missing": "skipped", "crashing": "failed"}
    assert "no such cache" in r["rows"][0]["error"]


def test_prefill_bounds(tiny_model):
    from transformers import DynamicCache

    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="5"):
        list(incremental_chunks(tiny_model, ids, DynamicCache(config=tiny_model.config), 5))


def _bundled_model_present() -> bool:
    try:
        from kvlab.models import reference_model_path

        return (reference_model_path() / "config.json").is_file()
    except (ImportError, FileNotFoundError):
        return False


def test_cli_real_check_on_the_bundled_model():
    """`kvlab lab --real --json`: every exact cache matches the bundled model's full forward."""
    if not _bundled_model_present():
        pytest.skip("the bundled reference model is not in this checkout yet (scripts/train_reference.py)")
    import contextlib
    import io
    import json

    from kvlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["lab", "--real", "--json", "--tokens", "40", "--batch", "2"])
    result = json.loads(out.getvalue())
    assert code == 0 and result["all_passed"] is True
    assert result["tokens"] == 40 and result["batch"] == 2 and result["dtype"] == "float32"
    rows = {r["cache"]: r for r in result["rows"]}
    assert set(rows) == {"dynamic", "paged", "kivi-8-full-residual"}
    for row in rows.values():
        assert row["status"] == "ok" and row["rel_err"] <= 1e-4
