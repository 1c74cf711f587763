"""The video lab's parts: 3D RoPE, frame visibility, the frame KV cache, FLOPs counted against the formulas, and
KV bytes against ``kvlab video``'s ledger for the same shapes."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.lab import video_flops as vf
from kvlab.lab.video import ledger_check
from kvlab.lab.video_cache import FrameEntry, FrameKVCache, generate_cached, generate_full, visible_frames
from kvlab.lab.video_model import (
    FlopCounter,
    VideoConfig,
    apply_rope,
    frame_coords,
    make_noise,
    make_weights,
    rope_angles,
)

SMALL = VideoConfig(frames=6, height=2, width=3, n_layers=2, window_frames=2, steps=3)


# ── 3D RoPE ──────────────────────────────────────────────────────────────────────────────────────────────────
def _score(cfg, q, k, q_pos, k_pos):
    cq, sq = rope_angles(cfg, np.array([q_pos]))
    ck, sk = rope_angles(cfg, np.array([k_pos]))
    return float(np.sum(apply_rope(q, cq, sq) * apply_rope(k, ck, sk)))


def test_wan_split_of_the_head_dimension():
    assert VideoConfig(head_dim=32).rope_pairs == (6, 5, 5)  # 12 / 10 / 10 channels for t / h / w
    assert VideoConfig(head_dim=128).rope_pairs == (22, 21, 21)  # Wan 2.1 at head_dim 128: 44 / 42 / 42
    assert VideoConfig(head_dim=6).rope_pairs == (1, 1, 1)


def test_rope_scores_depend_on_the_offset_in_every_axis_and_only_on_the_offset():
    cfg = VideoConfig()
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((1, 1, cfg.head_dim)).astype(np.float32) for _ in range(2))
    base = _score(cfg, q, k, (7, 2, 3), (4, 1, 0))
    # the same offset (3, 1, 3) elsewhere: the same score (relative positions, per axis)
    assert _score(cfg, q, k, (12, 3, 3), (9, 2, 0)) == pytest.approx(base, abs=1e-5)
    for axis in range(3):  # changing the offset along any one axis changes the score
        moved = [4, 1, 0]
        moved[axis] += 1
        assert abs(_score(cfg, q, k, (7, 2, 3), tuple(moved)) - base) > 1e-3, axis


def test_rope_keeps_the_norm_and_frame_coords_are_raster_order():
    cfg = VideoConfig(height=2, width=3)
    coords = frame_coords(cfg, 5)
    assert coords.tolist() == [[5, 0, 0], [5, 0, 1], [5, 0, 2], [5, 1, 0], [5, 1, 1], [5, 1, 2]]
    x = np.random.default_rng(0).standard_normal((6, 2, cfg.head_dim)).astype(np.float32)
    rotated = apply_rope(x, *rope_angles(cfg, coords))
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    assert not np.allclose(rotated, x)


def test_positions_refuse_bad_input():
    cfg = VideoConfig()
    with pytest.raises(ValueError, match=r"`coords` must be \[tokens, 3\].*\(16, 2\)"):
        rope_angles(cfg, np.zeros((16, 2), np.int64))
    with pytest.raises(ValueError, match="`t` must be an int >= 0, got -1"):
        frame_coords(cfg, -1)


# ── visibility and the frame cache ────────────────────────────────────────────────────────────────────────────
def test_visible_frames_block_causal_and_sink_window():
    assert visible_frames(3).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert visible_frames(5, window_frames=2).astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 0, 1, 1, 1],  # frame 4: the sink, frames 2 and 3, itself; frame 1 is out of the window
    ]


def _entry(cfg, t, value=0.0):
    kv = [np.full((cfg.kv_heads, cfg.tokens_per_frame, cfg.head_dim), value, np.float32)] * cfg.n_layers
    return FrameEntry(t, frame_coords(cfg, t), list(kv), list(kv))


def test_frame_cache_keeps_sink_and_window_with_logical_times():
    cache = FrameKVCache(SMALL.n_layers, window_frames=2)
    for t in range(5):
        evicted = cache.append(_entry(SMALL, t, float(t)))
        assert evicted == ([t - 2] if t >= 3 else [])
    assert cache.frame_t == [0, 3, 4] and cache.evicted_t == [1, 2]
    assert cache.frames_held == 3 and cache.next_frame_t == 5
    assert cache.position_ids()[:, 0].tolist() == [0] * 6 + [3] * 6 + [4] * 6
    keys, _ = cache.layer_kv(1)
    assert keys.shape == (SMALL.kv_heads, 3 * SMALL.tokens_per_frame, SMALL.head_dim)
    assert keys[0, :, 0].tolist() == [0.0] * 6 + [3.0] * 6 + [4.0] * 6
    assert cache.nbytes == 3 * SMALL.kv_bytes_per_frame


def test_frame_cache_refuses_a_time_that_does_not_advance_and_wrong_layers():
    cache = FrameKVCache(SMALL.n_layers, window_frames=1)
    for t in range(3):
        cache.append(_entry(SMALL, t))
    with pytest.raises(ValueError, match="t=2 is not after the newest cached frame t=2"):
        cache.append(_entry(SMALL, 2))
    with pytest.raises(ValueError, match="2/2 layers, the cache has 3"):
        FrameKVCache(3).append(_entry(SMALL, 0))
    with pytest.raises(ValueError, match="window_frames.*got 0"):
        FrameKVCache(2, window_frames=0)


# ── FLOPs: counted in the run == formula ──────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("cfg", [SMALL, VideoConfig(frames=5, n_layers=1, kv_heads=4, window_frames=1)])
@pytest.mark.parametrize("window", [None, "cfg"])
def test_counted_flops_equal_the_formulas(cfg, window):
    window = cfg.window_frames if window == "cfg" else None
    weights, noise = make_weights(cfg), make_noise(cfg)
    fc = FlopCounter()
    generate_full(weights, cfg, noise, window_frames=window, fc=fc)
    assert fc.flops == vf.full_generation_flops(cfg, window)
    fc = FlopCounter()
    generate_cached(weights, cfg, noise, window_frames=window, fc=fc)
    assert fc.flops == vf.cached_generation_flops(cfg, window)
    if window is not None:
        fc = FlopCounter()
        generate_full(weights, cfg, noise, window_frames=window, reencode=True, fc=fc)
        assert fc.flops == vf.full_generation_flops(cfg, window, reencode=True)


def test_flop_formulas_by_hand():
    # 1 layer, 1 head of 6, T = 2 tokens, 1 channel, ffn 4 x 6 = 24: projections per token
    # 2 * (36 [q] + 2 * 36 [k, v] + 36 [o] + 2 * 144 [w1, w2]) = 864; w_in / w_out 2 * 1 * 6 = 12 per token
    cfg = VideoConfig(height=1, width=2, channels=1, n_layers=1, q_heads=1, kv_heads=1, head_dim=6, steps=1)
    assert vf.projection_flops_per_token(cfg) == 864
    # one cached step, 1 frame cached: 2 queries x 4 keys, 4 * 6 * 8 = 192; 2 * 864; in + out 2 * 2 * 12
    assert vf.cached_step_flops(cfg, 1) == 192 + 1728 + 48
    # full step over 2 frames = 4 tokens: 4 * 12 in, 4 * 864, 4 * 6 * 16 attention, 2 * 12 out
    assert vf.full_step_flops(cfg, 2) == 48 + 3456 + 384 + 24
    # clean pass, 1 layer: only w_in and the last layer's K and V (2 tokens x 2 x 2 x 6 x 6)
    assert vf.clean_pass_flops(cfg, 1) == 24 + 288


def test_lab_reports_counted_flops_and_ratio():
    from kvlab.lab.video import run_video_lab

    r = run_video_lab(SMALL)
    f = r["flops"]
    for name in ("full_recompute", "cached", "windowed_recompute", "evicting", "reencode"):
        assert f[name] == f[f"{name}_formula"], name
    assert f["ratio_full_over_cached"] == pytest.approx(f["full_recompute"] / f["cached"])
    assert f["ratio_full_over_cached"] > 1


def test_the_cache_saves_more_as_the_video_grows():
    ratios = [
        vf.full_generation_flops(c) / vf.cached_generation_flops(c)
        for c in (VideoConfig(frames=6), VideoConfig(frames=12), VideoConfig(frames=24))
    ]
    assert ratios[0] < ratios[1] < ratios[2]


# ── bytes: the lab's cache against kvlab video's ledger ───────────────────────────────────────────────────────
def test_cache_bytes_grow_per_frame_and_stay_flat_with_eviction():
    weights, noise = make_weights(SMALL), make_noise(SMALL)
    per_frame = 2 * SMALL.n_layers * SMALL.kv_heads * SMALL.head_dim * 4 * SMALL.tokens_per_frame
    full = generate_cached(weights, SMALL, noise)
    assert full.kv_bytes_after_frame == [per_frame * (f + 1) for f in range(SMALL.frames)]
    evicting = generate_cached(weights, SMALL, noise, window_frames=2)
    assert evicting.kv_bytes_after_frame == [per_frame * min(f + 1, 3) for f in range(SMALL.frames)]


def _kvlab_video(args, config, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(path) if a == "CONFIG.json" else a for a in args])
    assert code == 0
    return json.loads(out.getvalue())["clips"][0]


@pytest.mark.parametrize(
    "cfg", [VideoConfig(), SMALL, VideoConfig(kv_heads=4, head_dim=16, height=3, width=5)]
)
def test_kvlab_video_and_the_lab_agree_on_bytes(cfg, tmp_path):
    ledger = ledger_check(cfg)
    clip = _kvlab_video(ledger["kvlab_video_args"], ledger["model_config"], tmp_path)
    run = generate_cached(make_weights(cfg), cfg, make_noise(cfg))
    assert clip["tokens_per_frame"] == cfg.tokens_per_frame
    assert (
        clip["kv_bytes_first_latent_frame"]
        == run.cache.entries[0].nbytes
        == ledger["kv_bytes_first_latent_frame"]
    )
    assert clip["kv_bytes"] == run.kv_bytes_after_frame[-1] == run.cache.nbytes
    evicting = generate_cached(make_weights(cfg), cfg, make_noise(cfg), window_frames=cfg.window_frames)
    assert max(evicting.kv_bytes_after_frame) == ledger["kv_bytes_window"]
