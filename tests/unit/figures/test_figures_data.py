"""The figures' numbers come from kvlab.plan / kvlab.paging and match the mechanics chapter; `kvlab figures` writes them."""

import json

import pytest

from kvlab import figures
from kvlab.cli import main

GIB = 1024**3


def test_memory_ledger_numbers_are_the_seeds():
    d = figures.memory_ledger_data()
    assert round(d["weight_bytes"] / GIB, 2) == 14.96  # Llama-3-8B in BF16
    kv = dict(zip(d["batches"], d["kv_bytes"]))
    assert kv[1] == 1 * GIB and kv[32] == 32 * GIB  # 131072 B/token x 8192 tokens
    assert round(kv[32] / d["weight_bytes"], 2) == 2.14
    mha = d["curves"][-1]
    assert "MHA" in mha["label"]
    i = d["contexts"].index(8192)
    assert mha["kv_bytes"][i] == 4 * d["curves"][1]["kv_bytes"][i]  # 32 vs 8 KV heads, same batch 8
    assert round(d["kv_budget_bytes"] / GIB, 2) == 61.04


def test_video_numbers_are_the_seeds():
    d = figures.video_data()
    assert [round(c["kv_bytes"] / GIB, 2) for c in d["cases"]] == [52.73, 105.47, 316.41]
    assert d["cases"][0]["tokens"] == 432000


def test_roofline_without_probe_is_the_table_gpu():
    d = figures.roofline_data(run_probe=False)
    (panel,) = d["panels"]
    # A100 ridge (docs/plan.md, "Roofline")
    assert round(panel["peak_flops"] / panel["bandwidth_bytes_s"]) == 153
    points = {p["label"]: p["intensity"] for p in panel["points"]}
    assert points["decode g=1"] == 1 and points["decode g=4"] == 4
    assert round(points["prefill S=8192"], 1) == 3973.9


def test_roofline_probe_panel_uses_fp32_intensities():
    d = figures.roofline_data(
        run_probe=True, probe_kwargs={"matmul_n": 128, "stream_elements": 100_000, "repeat": 1}
    )
    local, gpu = d["panels"]
    assert local["peak_flops"] > 0 and local["bandwidth_bytes_s"] > 0
    for a, b in zip(local["points"], gpu["points"]):
        assert a["label"] == b["label"] and a["intensity"] == pytest.approx(b["intensity"] / 2)


def test_cli_writes_the_four_seed_figures(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), "--no-probe", "--no-append", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    for name in ("memory_ledger", "roofline", "paged_layout", "video"):
        path = tmp_path / f"fig_{name}.png"
        assert written[name] == str(path)
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 20_000
    data = json.loads((tmp_path / "figures.json").read_text())
    # docs/paging.md, drawn from this run
    assert data["paged_layout"]["A"]["uniform"]["k_paged"] == 214


def test_cli_draws_a_result(tmp_path, capsys, eval_result):
    result = tmp_path / "result.json"
    result.write_text(json.dumps(eval_result))
    out = tmp_path / "figs"
    assert main(["figures", "--out", str(out), "--no-probe", "--no-append", "--result", str(result)]) == 0
    assert (out / "eval_capacity.png").exists() and (out / "eval_window.png").exists()
    assert "no measured rows" not in capsys.readouterr().err


def test_cli_says_a_dry_run_result_has_no_eval_figures(tmp_path, capsys, monkeypatch):
    assert main(["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), "--label", "dry"]) == 0
    capsys.readouterr()
    drawn = []  # the mechanics figures are not what this checks: skip drawing them
    monkeypatch.setattr(figures, "write_figures", lambda out, **kw: drawn.append(kw["result"]) or {})
    argv = ["figures", "--out", str(tmp_path / "figs"), "--no-probe", "--no-append"]
    assert main([*argv, "--result", str(tmp_path / "dry.json")]) == 0
    err = capsys.readouterr().err
    assert "the eval result has no measured rows (dry run), so no eval figures" in err
    assert drawn[0]["status"] == "dry_run" and drawn[0]["rows"] == []
