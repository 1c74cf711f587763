"""Figures: each plot writes a PNG from plain dicts; eval figures draw the gates from the result."""

import numpy as np
import pytest

from kvlab import figures


def _png_pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(path)


def test_block_causal_mask():
    m = figures.block_causal_mask(3, 2)
    assert m.shape == (6, 6)
    assert m[0, 1] and m[1, 0]  # inside a frame: both ways
    assert m[2, 0] and not m[0, 2]  # later frames see earlier ones, not the other way
    assert m.sum() == 4 * (1 + 2 + 3)
    with pytest.raises(ValueError, match="0"):
        figures.block_causal_mask(0, 4)


def test_gate_bounds():
    bounds = figures.gate_bounds(
        {"max_nll_delta": 0.5, "min_topk_overlap": 0.6, "note": "x", "max_flag": True}
    )
    assert bounds == {"nll_delta": ("max", 0.5), "topk_overlap": ("min", 0.6)}
    assert figures.gate_bounds(None) == {}


def test_eval_figures_written(eval_result, tmp_path):
    paths = figures.plot_eval_figures(eval_result, tmp_path)
    assert [p.name for p in paths] == ["eval_capacity.png", "eval_window.png"]
    for p in paths:
        pixels = _png_pixels(p)
        assert pixels.shape[0] > 500 and pixels.shape[1] > 800
        assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50


def test_eval_figure_skips_missing_matrix(eval_result, tmp_path):
    eval_result["rows"] = [r for r in eval_result["rows"] if r["matrix"] == "capacity"]
    assert [p.name for p in figures.plot_eval_figures(eval_result, tmp_path)] == ["eval_capacity.png"]


def test_gates_change_the_figure(eval_result, tmp_path):
    """The gate lines are drawn from the result: other gates, other pixels."""
    a = figures.plot_eval_matrix(eval_result, "capacity", "context_length", "context", tmp_path / "a.png")
    eval_result["gates"] = {"max_nll_delta": 0.05, "min_topk_overlap": 0.95, "max_latency_ratio": 1.1}
    b = figures.plot_eval_matrix(eval_result, "capacity", "context_length", "context", tmp_path / "b.png")
    pa, pb = _png_pixels(a), _png_pixels(b)
    assert pa.shape != pb.shape or not np.array_equal(pa, pb)


def test_append_cost_figure(tmp_path):
    data = {
        "contexts_tokens": [256, 512, 1024],
        "cat_us": [100.0, 200.0, 400.0],
        "inplace_us": [9.0, 9.5, 9.2],
        "shape": {"batch": 1, "kv_heads": 8, "head_dim": 128},
        "dtype": "float32",
    }
    out = figures.plot_append_cost(data, tmp_path / "sub" / "append.png")
    assert out.exists() and out.stat().st_size > 10_000
