"""The video KV cache figure: mask (read vs evicted frames) and bytes over frames, numbers from the lab's run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvlab import figures
from kvlab.cli import main
from kvlab.lab.video_model import VideoConfig

SMALL = VideoConfig(frames=6, window_frames=2, n_layers=2)


def _pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(path)


def test_data_come_from_the_lab_run():
    d = figures.video_cache_data(SMALL)
    per_frame = SMALL.kv_bytes_per_frame
    assert d["all_passed"] is True
    assert d["kv_bytes_after_frame"]["full_history"] == [per_frame * (f + 1) for f in range(6)]
    assert d["kv_bytes_after_frame"]["evicting"] == [per_frame * min(f + 1, 3) for f in range(6)]
    assert d["kv_bytes_window"] == 3 * per_frame
    assert np.array_equal(np.asarray(d["visible_frames"])[5], [1, 0, 0, 1, 1, 1])  # sink, frames 3-4, itself
    assert d["cached_rel_err"] <= 1e-5 and min(d["controls_rel_err"].values()) > 1e-3


def test_figure_is_drawn_from_its_mask_and_its_bytes(tmp_path):
    d = figures.video_cache_data(SMALL)
    pixels = _pixels(figures.plot_video_cache(d, tmp_path / "a.png"))
    assert pixels.shape[0] > 400 and pixels.shape[1] > 1000
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50
    no_eviction = {**d, "visible_frames": np.tril(np.ones((6, 6), int)).tolist()}  # only the mask changes
    grows = {**d, "kv_bytes_after_frame": {**d["kv_bytes_after_frame"], "evicting": [1, 2, 3, 4, 5, 6]}}
    for i, changed in enumerate((no_eviction, grows)):
        other = _pixels(figures.plot_video_cache(changed, tmp_path / f"{i}.png"))
        assert other.shape != pixels.shape or not np.array_equal(other, pixels), i


def test_a_mask_of_the_wrong_shape_is_named(tmp_path):
    d = figures.video_cache_data(SMALL)
    d["visible_frames"] = [[1, 0], [1, 1]]
    with pytest.raises(ValueError, match=r"`visible_frames` must be \[6, 6\], got \[2, 2\]"):
        figures.plot_video_cache(d, tmp_path / "x.png")


def test_kvlab_figures_writes_the_video_cache_figure(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), "--no-probe", "--no-append", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    path = tmp_path / "fig_video_cache.png"
    assert written["video_cache"] == str(path)
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 20_000
    data = json.loads((tmp_path / "figures.json").read_text())["video_cache"]
    assert data["kv_bytes_window"] == (1 + VideoConfig().window_frames) * VideoConfig().kv_bytes_per_frame
    assert data["all_passed"] is True
