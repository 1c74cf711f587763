"""The numbers the mechanics chapter's figures draw, computed by :mod:`kvlab.plan` in the same run (the planner's
default scenario, :mod:`kvlab.plan.scenario`, unless given)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlab.figures.base import (
    GIB,
)
from kvlab.plan.scenario import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_GPU,
    DEFAULT_GPU_MEMORY_GIB,
    DEFAULT_MODEL,
    DEFAULT_RESERVE_GIB,
)
from kvlab.plan.video import VideoClip

# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Data: every number computed by kvlab in this run
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# The defaults of the figures are the planner's default scenario (kvlab.plan.scenario): Llama-3-8B in BF16, an
# A100-80GB whose whole memory is the assumed budget (not a measured free-memory figure), a 4 GiB reserve for
# activations and framework, an 8,192-token context.


def _spec(model: Any):
    from kvlab.plan import load_spec

    return load_spec(model)


def memory_ledger_data(
    model: Any = DEFAULT_MODEL,
    *,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    batches: tuple[int, ...] = (1, 8, 16, 32, 64, 128),
    contexts: tuple[int, ...] = tuple(512 * 2**i for i in range(9)),
    curve_batches: tuple[int, ...] = (1, 8),
    mha_batch: int = 8,
    budget_gib: float = DEFAULT_GPU_MEMORY_GIB,
    overhead_gib: float = DEFAULT_RESERVE_GIB,
    kv: str = "auto",
) -> dict:
    """Numbers of :func:`plot_memory_ledger` from the planner: weights (``kvlab.plan.weight_bytes``) and KV bytes
    (``kvlab.plan.kv_bytes``) of ``model`` per batch and per context, plus the same model with one KV head per
    query head (MHA) for comparison (docs/plan.md, "Ledger and fit")."""
    import dataclasses

    from kvlab.plan import kv_bytes, weight_bytes

    spec = _spec(model)
    mha = dataclasses.replace(spec, num_kv_heads=spec.num_attention_heads)
    weights = weight_bytes(spec).total_bytes
    budget, overhead = budget_gib * GIB, overhead_gib * GIB
    curves = [
        {
            "label": f"{spec.num_kv_heads} KV heads (GQA) batch={b}",
            "kv_bytes": [kv_bytes(spec, c, b, kv) for c in contexts],
        }
        for b in curve_batches
    ]
    curves.append(
        {
            "label": f"{mha.num_kv_heads} KV heads (MHA) batch={mha_batch}",
            "kv_bytes": [kv_bytes(mha, c, mha_batch, kv) for c in contexts],
            "dashed": True,
        }
    )
    return {
        "model": spec.name,
        "context_tokens": context_tokens,
        "weight_bytes": weights,
        "overhead_bytes": overhead,
        "budget_bytes": budget,
        "budget_label": f"assumed budget {budget_gib:g} GiB",
        "batches": list(batches),
        "kv_bytes": [kv_bytes(spec, context_tokens, b, kv) for b in batches],
        "contexts": list(contexts),
        "curves": curves,
        "kv_budget_bytes": budget - weights - overhead,
    }


def roofline_data(
    gpu: str = DEFAULT_GPU,
    model: Any = DEFAULT_MODEL,
    *,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    groups: tuple[int, ...] = (1, 4, 8),
    run_probe: bool = True,
    probe_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """Numbers of :func:`plot_roofline`: the table GPU's datasheet roofs with bf16 intensities, and (``run_probe``)
    this machine's measured fp32 roofs (``kvlab.plan.probe``) with fp32 intensities, i.e. half the bf16 ones
    (docs/plan.md, "Roofline"). Points: ideal decode attention ``I = 2g/p`` for each ``g`` in ``groups`` and
    the mechanics chapter's prefill model of ``model`` at ``context_tokens``."""
    from kvlab.plan import decode_attention_intensity, get_hardware, prefill_intensity

    spec = _spec(model)
    hw = get_hardware(gpu)
    if hw.peak_flops is None:
        raise ValueError(f"{hw.name} has no datasheet FLOP/s: a roofline needs one, choose another `gpu`")
    prefill = prefill_intensity(
        spec.num_layers,
        spec.num_attention_heads,
        spec.head_dim,
        spec.num_parameters,
        spec.dtype_bytes,
        context_tokens,
    )["intensity_flop_per_byte"]

    def points(p: float) -> list[dict]:
        decode = [{"label": f"decode g={g}", "intensity": decode_attention_intensity(g, p)} for g in groups]
        return decode + [
            {"label": f"prefill S={context_tokens}", "intensity": prefill * spec.dtype_bytes / p}
        ]

    panels = []
    if run_probe:
        from kvlab.plan.probe import probe

        local = probe(**dict(probe_kwargs or {}))
        panels.append(
            {
                "title": "this machine (probe, fp32" + ("; busy: roofs not trusted)" if local.warnings else ")"),
                "peak_flops": local.peak_flops,
                "bandwidth_bytes_s": local.bandwidth_bytes_s,
                "points": points(4.0),
                "probe": local.to_dict(),
            }
        )
    panels.append(
        {
            "title": f"{hw.name} (datasheet, bf16)",
            "peak_flops": hw.peak_flops,
            "bandwidth_bytes_s": hw.bandwidth_bytes_s,
            "points": points(2.0),
            "source": hw.source,
        }
    )
    return {
        "model": spec.name,
        "panels": panels,
        "suptitle": "Ideal fused attention: roofline upper bounds (points are not measured kernel performance)",
    }


def video_data(
    model: Any = DEFAULT_MODEL,
    *,
    seconds: tuple[float, ...] = (5, 10, 30),
    fps: int = VideoClip.fps,
    width: int = VideoClip.width,
    height: int = VideoClip.height,
    temporal_compression: int = VideoClip.temporal_compression,
    spatial_compression: int = VideoClip.spatial_compression,
    budget_gib: float = DEFAULT_GPU_MEMORY_GIB,
    overhead_gib: float = DEFAULT_RESERVE_GIB,
    mask_frames: int = 5,
    mask_tokens_per_frame: int = 12,
) -> dict:
    """Numbers of :func:`plot_video` from ``kvlab.plan.video_kv``: tokens and KV bytes of one clip per duration
    with the whole history cached (docs/plan.md, "Video": 52.73 / 105.47 / 316.41 GiB for Llama-3-8B at 720p);
    frame rate, size and compression default to :class:`kvlab.plan.video.VideoClip`'s."""
    from kvlab.plan import video_kv, weight_bytes

    spec = _spec(model)
    cases = []
    for s in seconds:
        clip = video_kv(spec, VideoClip(s, fps, width, height, temporal_compression, spatial_compression))
        cases.append({"label": f"{s:g} s", "tokens": clip["tokens"], "kv_bytes": clip["kv_bytes"]})
    budget = budget_gib * GIB
    return {
        "mask_frames": mask_frames,
        "mask_tokens_per_frame": mask_tokens_per_frame,
        "cases": cases,
        "budget_bytes": budget,
        "kv_budget_bytes": budget - weight_bytes(spec).total_bytes - overhead_gib * GIB,
        "title": f"{spec.name}, {width}x{height} {fps} fps, {temporal_compression}x temporal and "
        f"{spatial_compression}x{spatial_compression} spatial compression, whole history cached",
    }
