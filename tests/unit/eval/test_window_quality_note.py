"""The residual-window table's note on transformers' QuantizedCache (HQQ, quanto): its first update quantizes the
whole prompt whatever R is, so its teacher-forced quality numbers cannot move with R unless the quality pass feeds
more than R + 1 tokens; the reports say so under the window table (text and HTML), and the measurement shows it."""

from __future__ import annotations

import copy
import html
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from kvlab.eval.decision_words import window_quality_note
from kvlab.eval.render import print_summary
from kvlab.report_html import render_html
from tests.conftest import make_tiny_qwen2, random_prompt

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
DEFAULT = "eval-smollm2-default-cpu-2026-12-02.json"  # hqq-4 at R 16/32/64, 16 quality tokens
KIVI_ONLY = "eval-quick-kivi-snapkv-2026-12-01.json"  # a window matrix without HQQ


def _record(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


def _text(result: dict) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None, record=True)
    print_summary(result, console)
    return " ".join(console.export_text().split())


def test_the_note_stands_under_the_window_table_in_both_reports():
    result = _record(DEFAULT)
    note = window_quality_note(result)
    assert note.startswith("hqq-4 is transformers' QuantizedCache, which quantizes the whole prompt at the prefill")
    assert "ΔNLL, top-k and KL over the 16 teacher-forced tokens cannot change with R here" in note
    assert "(they would at R below 15)" in note and "bytes and latency" in note
    text = _text(result)
    window, legend = text.index("Residual-window matrix"), text.index("columns: R/G")
    assert window < text.index(f"note: {note}") < legend  # under the window table, before the column legend
    page = render_html(result)
    table = page.index("Table: window matrix")
    assert table < page.index(f'<p class="muted">note: {html.escape(note)}</p>') < page.index("Passkey retrieval")


def test_the_recorded_numbers_are_what_the_note_says():
    """In the recorded run hqq-4's teacher-forced numbers are one value at R 16, 32 and 64, its bytes three."""
    rows = [r for r in _record(DEFAULT)["rows"] if r["matrix"] == "window" and r["candidate"] == "hqq-4"]
    assert len(rows) == 3
    for key in ("nll_delta", "topk_overlap", "kl_mean"):
        assert len({r[key] for r in rows}) == 1, key
    assert len({r["cache_bytes"] for r in rows}) == 3


def test_no_note_without_a_quantized_cache_row_and_the_wording_where_r_can_matter():
    assert window_quality_note(_record(KIVI_ONLY)) is None
    assert "note: " not in _text(_record(KIVI_ONLY)).split("Residual-window matrix")[1].split("columns:")[0]
    result = copy.deepcopy(_record(DEFAULT))
    result["settings"]["quality_tokens"] = 40  # 39 tokens fed: R = 16 and 32 re-quantize before the last forward
    assert "change with R only at R below 39 (here R = 16, 32)" in window_quality_note(result)
    result["rows"] = [r for r in result["rows"] if r["candidate"] != "hqq-4"]
    assert window_quality_note(result) is None


def test_hqq_quality_moves_with_r_only_past_r_plus_one_fed_tokens():
    """The fact behind the note, measured: transformers' HQQ QuantizedCache scored on 16 teacher-forced tokens after
    a float prefill gives one NLL at R = 16 and 32; on 40 tokens R = 16 re-quantizes before the last forwards and
    the NLL moves. Fails when transformers starts keeping the prompt's newest R tokens in float (then the note is
    wrong)."""
    pytest.importorskip("hqq")
    from kvlab.eval.candidates import Candidate
    from kvlab.eval.metrics import fixed_continuation

    model = make_tiny_qwen2(head_dim=32, max_positions=512)
    ids, continuation = random_prompt(1, 128), random_prompt(1, 40, seed=1)
    hqq = Candidate.parse("hqq-4")

    def nll(tokens: int, residual: int) -> float:
        cache = hqq.make(model.config, residual, 16, 32)
        return fixed_continuation(model, ids, continuation[:, :tokens], cache, 5)["mean_nll"]

    assert nll(16, 16) == nll(16, 32)
    assert nll(40, 16) != nll(40, 32)
