"""The autoregressive video KV cache lab (docs/lab.md): a frame KV cache equals full recompute, the
evicting cache equals recompute under its own visibility, and each known mistake does not."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.lab.video import CONTROL_FACTOR, TOLERANCE, compare, run_video_lab
from kvlab.lab.video_cache import generate_cached, generate_full
from kvlab.lab.video_model import VideoConfig, make_noise, make_weights

CFG = VideoConfig()


@pytest.fixture(scope="module")
def lab():
    """The default run, once for every test that reads it."""
    return run_video_lab()


@pytest.fixture(scope="module")
def setup():
    """Weights, noise and both references of the default configuration."""
    weights, noise = make_weights(CFG), make_noise(CFG)
    return {
        "weights": weights,
        "noise": noise,
        "full": generate_full(weights, CFG, noise),
        "windowed": generate_full(weights, CFG, noise, window_frames=CFG.window_frames),
    }


def _rel(a, b):
    return compare(a, b)["rel_err"]


def test_cached_equals_full_recompute(lab):
    r = lab["cached_vs_full"]
    assert r["rel_err"] <= TOLERANCE
    assert r["ref_scale"] > 0.5  # the latents are not trivially small
    assert lab["checks"]["cached_equals_full_recompute"]


def test_evicting_cache_equals_recompute_under_its_visibility(lab):
    assert lab["evicting_vs_windowed"]["rel_err"] <= TOLERANCE
    w, f = CFG.window_frames, CFG.frames
    assert lab["cache_frame_t"] == [0, *range(f - w, f)]  # the sink and the newest window
    assert lab["evicted_frame_t"] == list(range(1, f - w))
    assert lab["cache_next_frame_t"] == f  # logical, not the 1 + w frames held
    # eviction does change the video: the reference is not the block-causal run
    assert lab["context"]["windowed_vs_full_rel_diff"] > CONTROL_FACTOR * TOLERANCE


def test_kept_frames_reencoded_are_not_what_the_cache_holds(lab):
    # the cached K/V of a kept frame were computed while it could see frames evicted since
    assert lab["context"]["reencode_vs_evicting_rel_diff"] > CONTROL_FACTOR * TOLERANCE


def test_control_noisy_history_fails(setup):
    run = generate_cached(setup["weights"], CFG, setup["noise"], history="noisy")
    assert _rel(run.latents, setup["full"]) > CONTROL_FACTOR * TOLERANCE
    # frame 0 reads no history, so it is still right: the error comes from the cached history
    assert _rel(run.latents[:1], setup["full"][:1]) <= TOLERANCE


def test_control_positions_from_cache_length_fails_after_eviction(setup):
    w = CFG.window_frames
    run = generate_cached(setup["weights"], CFG, setup["noise"], window_frames=w, positions="from_length")
    assert _rel(run.latents, setup["windowed"]) > CONTROL_FACTOR * TOLERANCE
    assert run.frame_t_used[w + 2 :] == [w + 1] * (CFG.frames - w - 2)  # stuck at the frames held
    # before the first eviction the length is the logical time: those frames are right
    assert _rel(run.latents[: w + 2], setup["windowed"][: w + 2]) <= TOLERANCE
    # the cache still records each frame's logical time, and its coordinates show the time actually used
    entry = run.cache.entries[-1]
    assert entry.t == CFG.frames - 1 and entry.coords[0, 0] == w + 1


def test_positions_from_cache_length_are_harmless_without_eviction(setup, lab):
    run = generate_cached(setup["weights"], CFG, setup["noise"], positions="from_length")
    assert _rel(run.latents, setup["full"]) <= TOLERANCE
    assert lab["positions_from_length_without_eviction"] <= TOLERANCE


def test_control_current_block_reused_across_steps_fails(setup):
    run = generate_cached(setup["weights"], CFG, setup["noise"], current_block="reuse")
    assert _rel(run.latents, setup["full"]) > CONTROL_FACTOR * TOLERANCE


def test_current_block_reuse_is_harmless_with_one_step():
    # with one denoising step nothing is reused: the control fails because of the later steps only
    cfg = VideoConfig(steps=1, frames=4, window_frames=1)
    weights, noise = make_weights(cfg), make_noise(cfg)
    run = generate_cached(weights, cfg, noise, current_block="reuse")
    assert _rel(run.latents, generate_full(weights, cfg, noise)) <= TOLERANCE


def test_lab_reports_every_control_failing(lab):
    assert [c["name"] for c in lab["controls"]] == [
        "noisy_history",
        "positions_from_length",
        "current_block_reused",
    ]
    for control in lab["controls"]:
        assert control["failed_as_expected"] is True
        assert control["rel_err"] > CONTROL_FACTOR * TOLERANCE
    assert lab["checks"]["every_control_fails"] and lab["all_passed"]


@pytest.mark.parametrize(
    "changes",
    [
        {"kv_heads": 4, "n_layers": 2, "height": 3, "width": 5, "frames": 6, "window_frames": 2},
        {"q_heads": 2, "kv_heads": 1, "head_dim": 12, "steps": 2, "frames": 5, "window_frames": 1},
    ],
)
def test_other_shapes_agree_too(changes):
    r = run_video_lab(VideoConfig(**changes))
    assert r["cached_vs_full"]["rel_err"] <= TOLERANCE
    assert r["evicting_vs_windowed"]["rel_err"] <= TOLERANCE
    assert r["all_passed"], r["checks"]


def test_generated_frames_differ_from_each_other(setup):
    # a lab that generated the same frame every time would agree trivially
    full = setup["full"]
    assert min(np.max(np.abs(full[i] - full[i + 1])) for i in range(CFG.frames - 1)) > 0.1


def test_a_control_that_cannot_fail_is_reported_as_such(monkeypatch):
    # one denoising step: reusing the first step's K/V reuses nothing, so that control agrees with recompute.
    # The config check refuses it up front; past that check (the safety net for any config it misses) the lab must
    # say so (failed_as_expected False, all_passed False) instead of passing it
    import kvlab.lab.video as video

    with pytest.raises(ValueError, match=r"`steps` \(1\) must be >= 2"):
        run_video_lab(VideoConfig(steps=1, frames=5, window_frames=1))
    monkeypatch.setattr(video, "check_lab_config", lambda cfg: None)
    r = run_video_lab(VideoConfig(steps=1, frames=5, window_frames=1))
    reuse = next(c for c in r["controls"] if c["name"] == "current_block_reused")
    assert reuse["rel_err"] <= TOLERANCE and reuse["failed_as_expected"] is False
    assert not r["checks"]["every_control_fails"] and r["all_passed"] is False
    assert r["blas_threads"] in (
        video.BLAS_THREADS,
        None,
    )  # numpy's OpenBLAS held to one thread (None: not found)


def test_a_cache_that_does_not_evict_fails_the_byte_check(monkeypatch):
    import kvlab.lab.video as video

    real = video.generate_cached

    def never_evicts(weights, cfg, noise, *, window_frames=None, **kw):
        return real(weights, cfg, noise, **kw)

    monkeypatch.setattr(video, "generate_cached", never_evicts)
    r = run_video_lab(VideoConfig(frames=5, window_frames=1))
    assert r["checks"]["evicting_bytes_flat_at_window"] is False
    assert r["checks"]["logical_positions_kept"] is True  # positions stay right; the bytes do not flatten


def test_sampler_renoises_to_the_next_level_with_fresh_noise():
    from kvlab.lab.video_model import renoise, timestep_embedding

    cfg = VideoConfig(steps=4)
    np.testing.assert_allclose(cfg.sigmas, [1.0, 0.75, 0.5, 0.25])
    x0, noise = np.full((2, 3), 2.0, np.float32), np.full((2, 3), -1.0, np.float32)
    np.testing.assert_allclose(renoise(cfg, x0, noise, 1), 0.25 * 2.0 + 0.75 * -1.0)
    np.testing.assert_allclose(renoise(cfg, x0, noise, 3), 0.75 * 2.0 + 0.25 * -1.0)
    clean = timestep_embedding(cfg, 0.0)  # a clean frame: cos 0 = 1, sin 0 = 0
    assert clean.shape == (cfg.d_model,) and clean[: cfg.d_model // 2].tolist() == [1.0] * (cfg.d_model // 2)
    assert not np.allclose(timestep_embedding(cfg, 0.25), clean)
