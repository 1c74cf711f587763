"""The summary warns when the selected cache is an evicting one whose budget held the whole prompt of its cell."""

import json
from pathlib import Path

import pytest

from kvlab.eval.decision import EVICTION_UNTESTED_RATIO, eviction_warning, summarize

RECORD = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-quick-eviction-2026-12-01.json"


def row(candidate: str, family: str, ratio: float, context: int = 256) -> dict:
    return {"candidate": candidate, "family": family, "context_length": context, "cache_bytes_ratio": ratio}


def test_a_recorded_run_that_picked_a_sink_cache_holding_the_prompt_is_warned():
    """docs/examples' quick eviction run selects the 4-sink + 256 cache at 256 tokens (0.96x the float bytes)."""
    result = json.loads(RECORD.read_text(encoding="utf-8"))
    summary = summarize(result)
    assert summary["decision"] == "accept sink at context 256"
    warning = summary["eviction_warning"]
    assert warning is not None and "sink" in warning and "0.96x" in warning and "256 tokens" in warning


@pytest.mark.parametrize("family", ["sink", "snapkv", "tova"])
def test_every_evicting_family_is_warned_at_or_above_the_ratio(family):
    assert eviction_warning(row(family, family, EVICTION_UNTESTED_RATIO)) is not None
    assert eviction_warning(row(family, family, EVICTION_UNTESTED_RATIO - 0.01)) is None  # it dropped tokens


@pytest.mark.parametrize("family", ["kivi", "hqq", "fp8", "dynamic", "no-such-family"])
def test_caches_that_keep_every_token_are_not_warned(family):
    assert eviction_warning(row(family, family, 0.99)) is None


def test_no_selection_no_warning():
    assert eviction_warning(None) is None
