"""Adding a cache is one class and one registry entry: a family written here only (a test-only cache, with a
setting of its own and planner bytes) runs through the registry test matrix, ``kvlab eval --candidates``,
``kvlab bench decode --candidates`` and ``kvlab plan --kv-dtype`` with no other file touched (CONTRIBUTING.md,
Adding a cache)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from transformers.cache_utils import DynamicCache

from kvlab.caches.entry import CacheEntry
from kvlab.caches.registry import REGISTRY, cache_names, resolve
from kvlab.plan.config_fields import DTYPE_BYTES
from kvlab.plan.kv_formats import KVDtype, PlannerBytes
from kvlab.runtime.checks import check_int
from tests.unit.caches.test_registry import PROMPT_TOKENS, SETTINGS, _generate


@dataclass(frozen=True)
class CountingSettings:
    """The family's one knob (a name overrides it: ``counting:stride=4``)."""

    stride: int = 1  # how often update() counts a call; any value keeps the logits exact

    def __post_init__(self) -> None:
        check_int("stride", self.stride, 1)


class CountingCache(DynamicCache):
    """A DynamicCache that counts its ``update`` calls: exact, and trivially a cache of its own."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride, self.updates = stride, 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kw: Any
    ):
        self.updates += 1
        return super().update(key_states, value_states, layer_idx, *args, **kw)


ENTRY = CacheEntry(
    "counting",
    "test-only: a DynamicCache counting its updates",
    lambda model_config, name, s: CountingCache(s.stride),
    options=CountingSettings,
    describe=lambda name, s: {"stride": s.stride},
    # K and V in the model dtype, as DynamicCache keeps them: 2 * kv_heads * head_dim * p B per token per layer
    planner=PlannerBytes(
        lambda name, model_dtype, group_size, residual: KVDtype(name, DTYPE_BYTES[model_dtype])
    ),
)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(REGISTRY, ENTRY.family, ENTRY)


def test_the_new_family_resolves_with_its_own_setting(registered):
    assert cache_names("counting") == ["counting"]
    assert resolve("counting:stride=4").settings == CountingSettings(4)
    assert resolve("counting").describe() == {"name": "counting", "family": "counting", "stride": 1}
    with pytest.raises(ValueError, match="`stride` must be an int >= 1, got 0"):
        resolve("counting:stride=0")


def test_the_new_family_passes_the_registry_matrix(registered):
    """The registry matrix's check for an exact cache: DynamicCache's tokens and logits."""
    import kvlab.attention
    from tests.conftest import make_tiny_qwen2

    model = kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))
    prompt = torch.randint(1, 256, (2, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    ref_tokens, ref_logits = _generate(model, prompt, resolve("dynamic", SETTINGS).make(model.config))
    for name in cache_names("counting"):
        made = resolve(name, SETTINGS).make(model.config)
        tokens, logits = _generate(model, prompt, made)
        assert made.updates > 0
        assert torch.equal(tokens, ref_tokens) and torch.equal(logits, ref_logits), name


def test_the_new_family_is_an_eval_candidate(registered, tmp_path):
    from kvlab.cli import main

    argv = ["eval", "--quick", "--candidates", "dynamic,counting", "--contexts", "64", "--new-tokens", "2"]
    argv += ["--quality-tokens", "2", "--no-long-context", "--window-residuals", "none", "--warmup", "1"]
    argv += ["--repeat", "1", "--threads", "1", "--device", "cpu", "--label", "c", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert [c["name"] for c in result["candidates"]] == ["dynamic", "counting"]
    assert result["candidates"][1]["stride"] == 1
    rows = [r for r in result["rows"] if r["candidate"] == "counting"]
    assert rows and not result["failures"]
    assert all(r["greedy_exact_match"] and r["kl_mean"] == 0 and r["cache_bytes_ratio"] == 1 for r in rows)


def test_the_new_family_is_a_bench_decode_candidate(registered, capsys):
    from kvlab.cli import main

    argv = ["bench", "decode", "--candidates", "dynamic,counting", "--contexts", "32", "--steps", "1"]
    assert main([*argv, "--warmup", "0", "--device", "cpu", "--no-save", "--json"]) == 0
    rows = {r["candidate"]: r for r in json.loads(capsys.readouterr().out)["result"]["rows"]}
    assert rows["counting"]["status"] == "ok" and rows["counting"]["median_ms"] > 0


def test_the_new_family_is_sized_by_kvlab_plan(registered, tmp_path, capsys):
    """``kvlab plan --kv-dtype counting`` lists and sizes the family from its planner bytes: the bytes the cache
    measures after a prefill of ``batch`` x ``tokens`` (kvlab.caches.measure.cache_nbytes), and no KIVI flags."""
    from kvlab.caches.measure import cache_nbytes
    from kvlab.cli import main
    from kvlab.runtime.hf_api import cache_kwarg
    from tests.conftest import make_tiny_qwen2, random_prompt

    model = make_tiny_qwen2(head_dim=32, max_positions=512)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**model.config.to_dict(), "torch_dtype": "float32"}))
    batch, tokens = 2, 37
    cache = resolve("counting").make(model.config)
    with torch.no_grad():
        model(random_prompt(batch, tokens), use_cache=True, **{cache_kwarg(model): cache})
    argv = ["plan", str(config), "--kv-dtype", "counting", "--context", str(tokens), "--batch", str(batch)]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kv_dtype"]["name"] == "counting" and r["kv_dtype"]["element_bytes"] == 4
    assert r["kv_bytes_total"] == cache_nbytes(cache) > 0
    assert r["kv_bytes_per_token"] * tokens * batch == cache_nbytes(cache)
    assert main([*argv, "--group-size", "64"]) == 2  # the family's settings take no KIVI G
    assert "--group-size 64 sizes a kivi --kv-dtype" in capsys.readouterr().err
