"""Roofline for decode and prefill: arithmetic intensity, ridge point, decode step lower bound (the floor under TPOT,
time per output token; docs/plan.md, Roofline).

* Ideal fused single-query attention reads K and V once per KV head and shares them across the ``g`` query
  heads of the group: ``4 n_q d S`` FLOP over ``2 n_kv d S p`` bytes, so ``I = 2g/p`` whatever ``S``.
* Prefill (the mechanics chapter's illustrative model): ``2 N S`` projection FLOP plus causal attention FLOP over the weights
  plus ``10 S D p`` activation bytes per layer.
* A decode step must read the weights and every sequence's KV: ``T_step >= (W + batch * B_tok * S) / BW``; it
  must also do its FLOPs: ``T_step >= FLOP / peak``. Tokens/s is at most ``batch / T_step``.

These are upper bounds on speed under stated assumptions, not measurements. Pure Python; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvlab.plan.config_fields import KV_KINDS, check_int_at_least
from kvlab.plan.kv_formats import KVDtype, kv_dtype
from kvlab.plan.ledger import kv_bytes, tokens_stored
from kvlab.plan.spec import ModelSpec


def ridge_point_flop_per_byte(peak_flops: float, bandwidth_bytes_s: float) -> float:
    """``peak / bandwidth``: below this intensity a kernel is bandwidth-bound (docs/plan.md, Roofline).

    Raises:
        ValueError: ``peak_flops`` or ``bandwidth_bytes_s`` not a finite number > 0 (named), or a ratio that is
            not finite.
    """
    _check_positive("peak_flops", peak_flops)
    _check_positive("bandwidth_bytes_s", bandwidth_bytes_s)
    ridge = peak_flops / bandwidth_bytes_s
    if not 0 < ridge < math.inf:
        raise ValueError(
            f"`peak_flops` / `bandwidth_bytes_s` = {peak_flops!r} / {bandwidth_bytes_s!r} is not a finite number > 0"
        )
    return ridge


def _check_positive(name: str, value: object) -> None:
    """Refuse ``value`` unless it is a finite number > 0 (a divisor of a bound).

    Raises:
        ValueError: naming ``name`` and ``value``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")


def decode_attention_intensity(gqa_group: float, kv_bytes_per_element: float = 2.0) -> float:
    """``I_dec = 2g/p`` FLOP/byte of ideal fused single-query attention (docs/plan.md, Roofline).

    Args:
        gqa_group: ``g = n_q / n_kv`` (1 MHA, 4 Llama-3, ``n_q`` MQA).
        kv_bytes_per_element: ``p``: 2 for bf16, 1 for fp8, ``b/8 + 2m/G`` for KIVI.
    """
    if not gqa_group > 0 or not kv_bytes_per_element > 0:
        raise ValueError(f"g and p must be > 0, got {gqa_group!r} and {kv_bytes_per_element!r}")
    return 2.0 * gqa_group / kv_bytes_per_element


def mla_decode_attention_intensity(
    num_q_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, kv_bytes_per_element: float = 2.0
) -> float:
    """Ideal decode intensity of MLA with the up-projections absorbed (DeepSeek-V2 arXiv:2405.04434 section 2.1.2).

    Each query head scores against the cached latent and RoPE key (``2 (r + d_rope)`` FLOP per token) and
    sums the latent (``2 r``), while the cache is read once: ``(r + d_rope) p`` bytes per token, so
    ``I = 2 n_q (2r + d_rope) / ((r + d_rope) p)``. MLA is its own structure, not a larger ``g`` (docs/plan.md, Roofline).
    """
    r, rope = kv_lora_rank, qk_rope_head_dim
    return 2.0 * num_q_heads * (2 * r + rope) / ((r + rope) * kv_bytes_per_element)


def model_decode_attention_intensity(spec: ModelSpec, kv: str | KVDtype = "auto") -> float:
    """:func:`decode_attention_intensity` (or the MLA form) for ``spec`` and its KV dtype."""
    kvd = kv_dtype(kv, spec.dtype)
    p = float(kvd.bytes_per_element)
    if spec.is_mla:
        return mla_decode_attention_intensity(
            spec.num_attention_heads, spec.kv_lora_rank, spec.qk_rope_head_dim, p
        )
    return decode_attention_intensity(spec.gqa_group, p)


def prefill_intensity(
    num_layers: int, num_q_heads: int, head_dim: int, num_parameters: float, dtype_bytes: int, seq_len: int
) -> dict[str, float]:
    """kvlab's illustrative prefill intensity (docs/plan.md, Roofline).

    ``attention = L * 2 * (2 n_q d * S(S+1)/2)`` (causal QK^T and AV), ``projections = 2 N S``,
    ``bytes = N p + L * 10 * S * D * p`` with ``D = n_q d`` (weights once, a rough activation traffic).
    Llama-3-8B (N = 8.03e9) at S = 8192 in bf16: 3973.9 FLOP/byte. Not a per-operator traffic measurement.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"`seq_len` must be a non-negative integer, got {seq_len!r}")
    attention = num_layers * 2 * (2 * num_q_heads * head_dim * seq_len * (seq_len + 1) / 2)
    projections = 2 * num_parameters * seq_len
    weight_bytes = num_parameters * dtype_bytes
    activation_bytes = num_layers * 10 * seq_len * num_q_heads * head_dim * dtype_bytes
    total_bytes = weight_bytes + activation_bytes
    return {
        "seq_len": seq_len,
        "attention_flops": attention,
        "projection_flops": projections,
        "bytes": total_bytes,
        "intensity_flop_per_byte": (attention + projections) / total_bytes,
    }


def decode_flops_per_step(
    spec: ModelSpec, context: int, batch: int, keep_tokens: int | None = None
) -> float | None:
    """FLOPs of one decode step for ``batch`` sequences at ``context`` tokens.

    Per sequence: ``2 * N_mm`` for the weight matmuls, where ``N_mm`` (``ModelSpec.num_decode_flop_parameters``)
    is the active parameters less the input embedding table with the LM head counted once whether tied or not
    (Kaplan et al., arXiv:2001.08361 Table 1: the embedding is a lookup of ~0 FLOPs, the de-embedding costs
    ``2 n_vocab d_model``); plus attention over the cached tokens (``4 n_q d t`` per KV layer: QK^T and
    AV, or the absorbed MLA count). KV-shared layers' attention is left out, so this stays a lower bound.
    ``keep_tokens``: an evicting cache's cap, attention runs over ``min(t, keep_tokens)`` cached tokens.
    ``None`` when the parameter count is unknown.
    """
    if spec.num_decode_flop_parameters is None:
        return None
    per_token = 0.0
    for kind in spec.layer_kinds:
        if kind in KV_KINDS:
            t = tokens_stored(spec, kind, context)
            t = t if keep_tokens is None else min(t, keep_tokens)
            if spec.is_mla:
                per_token += (
                    2 * spec.num_attention_heads * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim) * t
                )
            else:
                per_token += 4 * spec.num_attention_heads * spec.head_dim * t
    return batch * (2.0 * spec.num_decode_flop_parameters + per_token)


@dataclass(frozen=True)
class DecodeStepBound:
    """Lower bound on one decode step's time on one device (docs/plan.md, Roofline)."""

    weight_bytes: int  # weights read per step
    kv_bytes: int  # K/V of every sequence read per step
    batch: int  # sequences decoded per step
    bandwidth_bytes_s: float  # memory bandwidth
    flops_per_step: float | None = None  # FLOPs of the step, when known
    peak_flops: float | None = None  # peak FLOP/s, when known

    def __post_init__(self) -> None:
        """Raises ValueError naming a negative byte count, a batch < 1, a bandwidth or peak FLOP/s that is not a
        finite number > 0 (a bound would divide by 0), FLOPs that are negative or not finite, or a bound that is 0
        (nothing to read or compute) or overflows (too many bytes or FLOPs for a float at this bandwidth or peak)."""
        check_int_at_least("weight_bytes", self.weight_bytes, 0)
        check_int_at_least("kv_bytes", self.kv_bytes, 0)
        _check_positive("bandwidth_bytes_s", self.bandwidth_bytes_s)
        if self.peak_flops is not None:
            _check_positive("peak_flops", self.peak_flops)
        if self.flops_per_step is not None and not 0 <= self.flops_per_step < math.inf:
            raise ValueError(f"`flops_per_step` must be a finite number >= 0, got {self.flops_per_step!r}")
        check_int_at_least("batch", self.batch, 1)
        if not 0 < self.lower_bound_s < math.inf:
            raise ValueError(
                f"the decode step bound of {self.bytes_per_step!r} bytes at `bandwidth_bytes_s` "
                f"{self.bandwidth_bytes_s!r} (`peak_flops` {self.peak_flops!r}) is {self.lower_bound_s!r} s, "
                "not a finite number > 0"
            )

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def memory_bound_s(self) -> float:
        return self.bytes_per_step / self.bandwidth_bytes_s

    @property
    def compute_bound_s(self) -> float | None:
        if self.flops_per_step is None or self.peak_flops is None:
            return None
        return self.flops_per_step / self.peak_flops

    @property
    def lower_bound_s(self) -> float:
        compute = self.compute_bound_s
        return self.memory_bound_s if compute is None else max(self.memory_bound_s, compute)

    @property
    def limiter(self) -> str:
        compute = self.compute_bound_s
        return "compute" if compute is not None and compute > self.memory_bound_s else "memory"

    @property
    def tokens_per_s_upper_bound(self) -> float:
        return self.batch / self.lower_bound_s

    def compare(self, measured_step_ms: float) -> dict[str, Any]:
        """How a measured step compares: bound/measured and the bandwidth the step achieved.

        ``faster_than_bound`` is True (and ``warning`` says why that is impossible) when the measured step beats
        the lower bound: the bandwidth or peak FLOP/s given is too low for the device that ran it, or the
        measurement is wrong (it timed less than a whole step). ``warning`` is None otherwise.

        Raises:
            ValueError: ``measured_step_ms`` not a finite number > 0, or so small or large that a ratio it gives
                (fraction of the bound, GB/s achieved, tokens/s) is not a finite number (named, with the value).
        """
        if (
            isinstance(measured_step_ms, bool)
            or not isinstance(measured_step_ms, int | float)
            or not 0 < measured_step_ms < math.inf
        ):
            raise ValueError(f"`measured_step_ms` must be finite and > 0, got {measured_step_ms!r}")
        seconds = measured_step_ms / 1e3  # 0.0 for the smallest subnormal ms
        if seconds == 0:
            seconds = math.ulp(0.0)  # a ratio over it overflows below and is named there
        out = {
            "measured_step_ms": measured_step_ms,
            "fraction_of_bound": self.lower_bound_s / seconds,
            "achieved_bandwidth_gb_s": self.bytes_per_step / seconds / 1e9,
            "measured_tokens_per_s": self.batch / seconds,
        }
        words = {
            "fraction_of_bound": "the fraction of the bound",
            "achieved_bandwidth_gb_s": "the GB/s achieved",
            "measured_tokens_per_s": "the tokens/s",
        }
        bad = [words[k] for k, v in out.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(
                f"`measured_step_ms` {measured_step_ms!r} is out of range: {' and '.join(bad)} would be infinite "
                f"(the decode step lower bound is {self.lower_bound_s * 1e3:.6g} ms)"
            )
        faster = seconds < self.lower_bound_s
        out["faster_than_bound"] = faster
        out["warning"] = self._faster_warning(measured_step_ms) if faster else None
        return out

    def _faster_warning(self, measured_step_ms: float) -> str:
        """Why a step measured below the lower bound cannot be: the rate the bound is limited by is too low."""
        if self.limiter == "compute":
            rate = f"peak {self.peak_flops / 1e12:g} TFLOP/s ({self.flops_per_step:.4g} FLOP per step)"
        else:
            rate = f"bandwidth {self.bandwidth_bytes_s / 1e9:g} GB/s ({self.bytes_per_step:,} B per step)"
        return (
            f"measured step {measured_step_ms:g} ms is faster than the decode step lower bound "
            f"{self.lower_bound_s * 1e3:.4g} ms ({self.limiter}-bound), which no step on this device can beat: the "
            f"{rate} the bound assumes is below the device that ran it (check --gpu, --bandwidth-gb-s, --tflops), "
            "or the measurement is wrong (it did not time a whole decode step)"
        )

    def to_dict(self) -> dict[str, Any]:
        compute = self.compute_bound_s
        return {
            "weight_bytes_read": self.weight_bytes,
            "kv_bytes_read": self.kv_bytes,
            "bytes_per_step": self.bytes_per_step,
            "flops_per_step": self.flops_per_step,
            "bandwidth_bytes_s": self.bandwidth_bytes_s,
            "peak_flops": self.peak_flops,
            "decode_step_memory_bound_ms": self.memory_bound_s * 1e3,
            "decode_step_compute_bound_ms": None if compute is None else compute * 1e3,
            "decode_step_lower_bound_ms": self.lower_bound_s * 1e3,
            "limiter": self.limiter,
            "tokens_per_s_upper_bound": self.tokens_per_s_upper_bound,
        }


def decode_step_bound(
    spec: ModelSpec,
    context: int,
    batch: int,
    weight_bytes_read: int,
    bandwidth_bytes_s: float,
    peak_flops: float | None = None,
    kv: str | KVDtype = "auto",
    tp: int = 1,
) -> DecodeStepBound:
    """:class:`DecodeStepBound` of ``spec`` on one of ``tp`` ranks: its weight shard plus its KV at ``context``
    (window-capped: a sliding layer reads only its window; a capped ``kv``, ``keep_tokens``, reads its kept
    tokens) for ``batch`` sequences.

    Raises:
        ValueError: ``weight_bytes_read`` not an int >= 0, or a bad context, batch, tp or rate (each named).
    """
    check_int_at_least("weight_bytes_read", weight_bytes_read, 0)
    kv_read = kv_bytes(spec, context, batch, kv, tp=tp)  # validates context, batch and tp
    flops = decode_flops_per_step(spec, context, batch, kv_dtype(kv, spec.dtype).keep_tokens)
    return DecodeStepBound(
        weight_bytes=-(-weight_bytes_read // tp),
        kv_bytes=kv_read,
        batch=batch,
        bandwidth_bytes_s=bandwidth_bytes_s,
        flops_per_step=None if flops is None else flops / tp,
        peak_flops=peak_flops,
    )


def intensity_table(
    groups: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    kv_bytes_per_element: float = 2.0,
    ridge: float | None = None,
) -> list[dict[str, Any]]:
    """``I = 2g/p`` for several ``g`` and, given a ridge point, whether each is below it (mechanics chapter [C1]/[C4])."""
    rows = []
    for g in groups:
        i = decode_attention_intensity(g, kv_bytes_per_element)
        bound = None if ridge is None else ("memory" if i < ridge else "compute")
        rows.append({"g": g, "intensity_flop_per_byte": i, "bound": bound})
    return rows
