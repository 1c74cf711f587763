"""KV memory ledger: bytes per token, per layer kind and in total, for a batch at a context.

docs/plan.md (Ledger and fit): ``B_tok = 2 * L * n_kv * d * p`` bytes per token and ``B_kv = B_tok * S * batch``; here ``L``
counts only layers that store K/V of their own, MLA layers store one latent of ``r + d_rope`` values, sliding
and chunked layers keep at most their window (*theoretical*) or the whole context (*allocated*, as engines that
reserve full length do), and the KV dtype is independent of the weight dtype: bf16/fp16/fp32/fp8, or kvlab's
KIVI cache (arXiv:2402.02750) with its exact flush rule and scale/zero metadata (see :func:`kivi_bytes_per_head`;
keys and values may have their own bits: ``kivi-k8v4``), or kvlab's FP8 cache (``fp8-e4m3``, ``fp8-e5m2-tensor``,
``fp8_e4m3``: 1 B per element plus its fp32 scales, :func:`fp8_scale_bytes`).

Tensor parallelism splits KV heads across ranks (replicated when ``tp`` exceeds the KV heads); an MLA latent is
replicated on every rank. Functions named ``*_per_gpu`` or taking ``tp`` return one rank's bytes.

The KV formats themselves (:class:`KVDtype`, :func:`kv_dtype`, the FP8 and KIVI tables) live in
:mod:`kvlab.plan.kv_formats`.

Pure functions; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.plan.config_fields import CHUNKED, FULL, KV_KINDS, SLIDING, check_int_at_least
from kvlab.plan.kv_formats import FP8_SCALE_BYTES, KIVI_NBITS, KVDtype, kv_dtype
from kvlab.plan.load import load_spec
from kvlab.plan.spec import ModelSpec
from kvlab.plan.weights import WeightBytes

MODES = ("theoretical", "allocated")


def _check_tp(spec: ModelSpec, tp: int) -> None:
    check_int_at_least("tp", tp, 1)
    if spec.num_attention_heads % tp:  # each rank holds whole query heads (as vLLM requires)
        raise ValueError(f"`tp` ({tp}) must divide the query heads ({spec.num_attention_heads})")


def kv_heads_per_rank(spec: ModelSpec, tp: int = 1) -> int:
    """KV heads one tensor-parallel rank stores: ``kv / tp``, or 1 (replicated) when ``tp > kv``.

    Raises:
        ValueError: ``tp`` < 1, ``tp`` not dividing the query heads, or neither of ``tp`` and the KV heads divides
            the other.
    """
    _check_tp(spec, tp)
    kv = spec.num_kv_heads
    if tp <= kv:
        if kv % tp:
            raise ValueError(f"`tp` ({tp}) must divide the KV heads ({kv})")
        return kv // tp
    if tp % kv:
        raise ValueError(f"`tp` ({tp}) must be a multiple of the KV heads ({kv}) to replicate them")
    return 1


def kv_elements_per_token_per_layer(spec: ModelSpec, tp: int = 1) -> int:
    """Elements one token adds to one KV-holding layer on one rank: ``2 * kv_heads_per_rank * head_dim``, or
    the whole MLA latent ``r + d_rope`` (replicated on every rank)."""
    if spec.is_mla:
        _check_tp(spec, tp)
        return spec.kv_elements_per_token_per_layer
    return 2 * kv_heads_per_rank(spec, tp) * spec.head_dim


def tokens_stored(spec: ModelSpec, kind: str, context: int, mode: str = "theoretical") -> int:
    """Tokens one sequence keeps in one layer of ``kind`` at ``context`` tokens.

    ``theoretical``: a sliding layer keeps ``min(context, sliding_window)``, a chunked layer at most
    ``min(context, attention_chunk_size)``; ``allocated``: both keep ``context`` (engines that reserve full
    length). Shared and no-KV layers keep 0.
    """
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise ValueError(f"`context` must be a non-negative integer, got {context!r}")
    if kind == FULL:
        return context
    if kind == SLIDING:
        return context if mode == "allocated" else min(context, spec.sliding_window)
    if kind == CHUNKED:
        return context if mode == "allocated" else min(context, spec.attention_chunk_size)
    return 0


def quantized_tokens(tokens: int, group_size: int, residual_length: int) -> int:
    """KIVI flush rule ``Q(T) = ((T - R) // G) * G if T > R else 0``: tokens held quantized out of ``T``.

    Raises:
        ValueError: ``tokens`` or ``residual_length`` not an int >= 0, or ``group_size`` not an int >= 1 (named).
    """
    check_int_at_least("tokens", tokens, 0)
    check_int_at_least("group_size", group_size, 1)
    check_int_at_least("residual_length", residual_length, 0)
    return (tokens - residual_length) // group_size * group_size if tokens > residual_length else 0


def kivi_bytes_per_head(
    tokens: int,
    head_dim: int,
    nbits: int,
    group_size: int,
    residual_length: int,
    cache_dtype_bytes: int,
    metadata_bytes: int,
    value_bits: int | None = None,
) -> dict[str, int]:
    """Exact KIVI bytes of one layer, one batch row, one KV head holding ``tokens`` tokens (``nbits`` for the keys
    and, unless ``value_bits`` is given, the values; ``codes = Q * D * (b_k + b_v) / 8`` then).

    With ``Q = Q(T)`` (:func:`quantized_tokens`), ``D`` head_dim, ``b`` nbits, ``G``, ``m`` metadata bytes and
    ``p`` cache dtype bytes (kvlab shared interface; KIVI arXiv:2402.02750 section 3)::

        codes        = 2 * Q * D * b / 8      K and V codes, bit-packed along head_dim
        scales_zeros = 2 * m * Q * D / G      K: per-channel scale + zero, one pair per G tokens per channel
                     + 2 * m * Q * D / G      V: per-token scale + zero, one pair per G channels per token
        residual     = 2 * (T - Q) * D * p    K and V of the newest tokens in the model dtype

    Returns ``{"codes", "scales_zeros", "residual", "total"}`` (the keys of ``KIVICache.nbytes_breakdown()``).

    Raises:
        ValueError: ``G`` not dividing ``head_dim`` (values are grouped per token along channels), ``D * b`` not
            a multiple of 8, or ``R`` not a multiple of ``G``.
    """
    value_bits = nbits if value_bits is None else value_bits
    for name, bits in (("nbits", nbits), ("value_bits", value_bits)):
        if bits not in KIVI_NBITS:
            raise ValueError(f"`{name}` must be one of {list(KIVI_NBITS)}, got {bits!r}")
        if head_dim * bits % 8:
            raise ValueError(f"head_dim ({head_dim}) times {name} ({bits}) must be a multiple of 8")
    if group_size < 1 or head_dim % group_size:
        raise ValueError(f"`group_size` ({group_size}) must divide head_dim ({head_dim})")
    if head_dim * nbits % 8:
        raise ValueError(f"head_dim ({head_dim}) times nbits ({nbits}) must be a multiple of 8")
    if residual_length < 0 or residual_length % group_size:
        raise ValueError(
            f"`residual_length` must be a non-negative multiple of {group_size}, got {residual_length}"
        )
    if tokens < 0:
        raise ValueError(f"`tokens` must be >= 0, got {tokens!r}")
    q = quantized_tokens(tokens, group_size, residual_length)
    codes = q * head_dim * nbits // 8 + q * head_dim * value_bits // 8
    scales_zeros = 2 * (2 * metadata_bytes * q * head_dim // group_size)
    residual = 2 * (tokens - q) * head_dim * cache_dtype_bytes
    return {
        "codes": codes,
        "scales_zeros": scales_zeros,
        "residual": residual,
        "total": codes + scales_zeros + residual,
    }


def kivi_kv_bytes_breakdown(
    model: ModelSpec | Mapping | str,
    tokens: int,
    batch: int = 1,
    *,
    nbits: int = 4,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    value_bits: int | None = None,
    cache_dtype_bytes: int | None = None,
    metadata_bytes: int | None = None,
    tp: int = 1,
    mode: str = "theoretical",
) -> dict[str, int]:
    """Exact bytes a KIVI cache holds for ``batch`` sequences of ``tokens`` tokens, summed over KV layers.

    Args:
        model: a :class:`ModelSpec`, a transformers config dict (e.g. ``model.config.to_dict()``) or anything
            :func:`~kvlab.plan.load.load_spec` accepts.
        cache_dtype_bytes: the residual window's bytes per element (default: the config dtype's).
        metadata_bytes: bytes of one scale or zero (default: 4 for a 4-byte cache dtype, else 2).
        value_bits: value code width when it differs from ``nbits`` (the keys'), e.g. 4 for ``kivi-k8v4``.

    Returns the keys of ``KIVICache.nbytes_breakdown()``: ``codes``, ``scales_zeros``, ``residual``, ``total``.

    Raises:
        ValueError: an MLA model (its latent has no K and V heads), ``batch`` not an int >= 0, or invalid KIVI
            settings.
    """
    check_int_at_least("batch", batch, 0)
    spec = load_spec(model)
    if spec.is_mla:
        raise ValueError("KIVI quantizes K per-channel and V per-token; an MLA latent has no K and V heads")
    p = spec.dtype_bytes if cache_dtype_bytes is None else cache_dtype_bytes
    m = (4 if p == 4 else 2) if metadata_bytes is None else metadata_bytes
    heads = kv_heads_per_rank(spec, tp)
    out = {"codes": 0, "scales_zeros": 0, "residual": 0, "total": 0}
    for kind in spec.layer_kinds:
        if kind not in KV_KINDS:
            continue
        t = tokens_stored(spec, kind, tokens, mode)
        per_head = kivi_bytes_per_head(t, spec.head_dim, nbits, group_size, residual_length, p, m, value_bits)
        for key in out:
            out[key] += per_head[key] * heads * batch
    return out


def kivi_kv_bytes(model: ModelSpec | Mapping | str, tokens: int, batch: int = 1, **kwargs: Any) -> int:
    """Total of :func:`kivi_kv_bytes_breakdown`: what ``KIVICache.nbytes()`` must measure.

    Args:
        model, tokens, batch: as :func:`kivi_kv_bytes_breakdown`. kwargs: its keyword-only settings (``nbits``,
            ``group_size``, ``residual_length``, ``value_bits``, ``cache_dtype_bytes``, ``metadata_bytes``, ``tp``,
            ``mode``).

    Raises:
        ValueError: as :func:`kivi_kv_bytes_breakdown` (an MLA model, a negative ``tokens`` or ``batch``, invalid
            KIVI settings, a model that cannot be read). TypeError: an unknown keyword (``nbit=4``).
    """
    return kivi_kv_bytes_breakdown(model, tokens, batch, **kwargs)["total"]


def _kivi_head_bytes(spec: ModelSpec, kvd: KVDtype, tokens: int) -> dict[str, int]:
    """:func:`kivi_bytes_per_head` of one KV head of ``spec`` holding ``tokens`` tokens under the KIVI ``kvd``."""
    if spec.is_mla:
        raise ValueError("KIVI quantizes K per-channel and V per-token; an MLA latent has no K and V heads")
    return kivi_bytes_per_head(
        tokens,
        spec.head_dim,
        kvd.nbits,
        kvd.group_size,
        kvd.residual_length,
        kvd.element_bytes,
        kvd.metadata_bytes,
        kvd.value_bits,
    )


def _layer_bytes(spec: ModelSpec, kvd: KVDtype, tokens: int, tp: int) -> int:
    """Bytes one sequence stores in one KV-holding layer with ``tokens`` tokens, on one rank."""
    if kvd.is_kivi:
        return _kivi_head_bytes(spec, kvd, tokens)["total"] * kv_heads_per_rank(spec, tp)
    return tokens * kv_elements_per_token_per_layer(spec, tp) * kvd.element_bytes + fp8_scale_bytes(
        spec, kvd, tokens, tp
    )


def _layer_metadata_bytes(spec: ModelSpec, kvd: KVDtype, tokens: int, tp: int) -> int:
    """The part of :func:`_layer_bytes` that is quantization metadata: KIVI's scales and zeros
    (:func:`kivi_bytes_per_head` ``scales_zeros``), an FP8 cache's scales (:func:`fp8_scale_bytes`), 0 otherwise."""
    if kvd.is_kivi:
        return _kivi_head_bytes(spec, kvd, tokens)["scales_zeros"] * kv_heads_per_rank(spec, tp)
    return fp8_scale_bytes(spec, kvd, tokens, tp)


def kv_metadata_bytes(
    spec: ModelSpec, tokens: int, batch: int = 1, kv: str | KVDtype = "auto", *, tp: int = 1
) -> int:
    """Bytes of quantization metadata inside :func:`kv_bytes` (theoretical): KIVI scale/zero pairs or FP8 scales of
    ``batch`` sequences of ``tokens`` tokens on one rank, summed over layers; 0 for a plain dtype.

    Raises:
        ValueError: as :func:`kv_bytes` (a bad ``batch``, KIVI or scaled FP8 on an MLA model).
    """
    return _over_layers(spec, tokens, batch, kv, tp, "theoretical", _layer_metadata_bytes)


def fp8_scale_bytes(spec: ModelSpec, kvd: KVDtype, tokens: int, tp: int = 1) -> int:
    """Bytes of an FP8 cache's scales in one layer, one sequence, one rank: one fp32 scale per K and V, and per KV
    head for ``per-head`` (``kvlab.caches.fp8``: calibrated on each sequence's prefill), none before the first token
    or for ``scale="none"`` / a plain dtype.

    Raises:
        ValueError: a scaled FP8 cache on an MLA model (its latent has no K and V heads).
    """
    if kvd.fp8_scale in (None, "none") or tokens == 0:
        return 0
    if spec.is_mla:
        raise ValueError(f"{kvd.name}: FP8Cache scales K and V per head; an MLA latent has no K and V heads")
    per_kv = kv_heads_per_rank(spec, tp) if kvd.fp8_scale == "per-head" else 1
    return 2 * per_kv * FP8_SCALE_BYTES


def _resolve(spec: ModelSpec, kv: str | KVDtype) -> KVDtype:
    """``kv`` for ``spec``; a rotated FP8 cache (``-hadamard``) needs a power-of-two head_dim, as the cache does
    (``kvlab.quant.rotation``: Sylvester's construction), so a plan the cache could not run is refused here too."""
    kvd = kv_dtype(kv, spec.dtype)
    d = spec.head_dim
    if kvd.name.endswith("-hadamard") and not spec.is_mla and (d <= 0 or d & (d - 1)):
        raise ValueError(
            f"`kv_dtype` {kvd.name!r}: a Hadamard rotation needs a power-of-two head_dim (Sylvester's construction), "
            f"the model's is {d}"
        )
    return kvd


def kv_bytes_per_token(spec: ModelSpec, kv: str | KVDtype = "auto", tp: int = 1) -> float | int:
    """Bytes one new token adds on one rank while every layer is within its window (docs/plan.md, Ledger and fit: ``B_tok``).

    Plain dtypes: an exact integer. KIVI: the long-context figure ``elements * (b/8 + 2m/G)`` (the residual
    window amortized away), a float when not integral.

    Args:
        spec: the model (:func:`~kvlab.plan.load.load_spec`).
        kv: a KV dtype name (``"auto"``: the model's dtype, ``"fp8"``, ``"kivi-4"``, ...) or a :class:`KVDtype`
            (:func:`~kvlab.plan.kv_formats.kv_dtype`).
        tp: tensor-parallel ranks (the KV heads are split between them, replicated when fewer than ``tp``).

    Raises:
        ValueError: an unknown ``kv`` name or invalid KIVI settings (:func:`~kvlab.plan.kv_formats.kv_dtype`), a
            Hadamard FP8 cache on a head_dim that is not a power of two, KIVI on an MLA model, ``tp`` not an int
            >= 1 or not splitting the query and KV heads (:func:`kv_heads_per_rank`).
    """
    kvd = _resolve(spec, kv)
    if kvd.is_kivi and spec.is_mla:
        raise ValueError("KIVI quantizes K per-channel and V per-token; an MLA latent has no K and V heads")
    per_layer = kv_elements_per_token_per_layer(spec, tp) * kvd.bytes_per_element
    value = per_layer * spec.kv_layers
    return int(value) if value.denominator == 1 else float(value)


def kv_bytes(
    spec: ModelSpec,
    tokens: int,
    batch: int = 1,
    kv: str | KVDtype = "auto",
    *,
    tp: int = 1,
    mode: str = "theoretical",
) -> int:
    """Exact bytes of ``batch`` sequences of ``tokens`` tokens on one rank, summed over layers
    (``B_kv = B_tok * S * batch`` of docs/plan.md, Ledger and fit for a plain full-attention model).

    Args:
        spec: the model (:func:`~kvlab.plan.load.load_spec`).
        tokens: tokens per sequence (prompt + generated so far).
        batch: sequences (0 gives 0).
        kv: the KV cache format: a name (``"auto"``: the model's dtype; ``"bf16"``, ``"fp8"``, ``"kivi-4"``,
            ``"kivi-4:group_size=64"``, ...) or a :class:`KVDtype` (:func:`~kvlab.plan.kv_formats.kv_dtype`); an
            evicting cache's cap (``keep_tokens``) limits the tokens each layer keeps.
        tp: tensor-parallel ranks; the bytes are one rank's.
        mode: ``"theoretical"``: what the model must keep: a sliding-window layer holds at most its window, a
            chunked-attention layer at most its chunk (as ``DynamicCache`` and kvlab's caches hold them);
            ``"allocated"``: every layer holds all ``tokens`` (an engine that reserves full length for every layer,
            window or not).

    Raises:
        ValueError: ``tokens`` (named ``context``) or ``batch`` not an int >= 0, ``mode`` not one of
            :data:`MODES`, and what :func:`kv_bytes_per_token` refuses (``kv``, ``tp``, KIVI or scaled FP8 on MLA).
    """
    return _over_layers(spec, tokens, batch, kv, tp, mode, _layer_bytes)


def _over_layers(
    spec: ModelSpec, tokens: int, batch: int, kv: str | KVDtype, tp: int, mode: str, per_layer
) -> int:
    """``per_layer(spec, kvd, tokens kept, tp)`` summed over the KV-holding layers, times ``batch`` (checked)."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 0:
        raise ValueError(f"`batch` must be a non-negative integer, got {batch!r}")
    kvd = _resolve(spec, kv)
    total = 0
    for kind in spec.layer_kinds:
        if kind in KV_KINDS:
            total += per_layer(spec, kvd, kvd.kept(tokens_stored(spec, kind, tokens, mode)), tp)
    return total * batch


def kv_bytes_peak(
    spec: ModelSpec,
    tokens: int,
    batch: int = 1,
    kv: str | KVDtype = "auto",
    *,
    tp: int = 1,
    mode: str = "theoretical",
) -> int:
    """The most bytes the cache holds at any length ``t <= tokens`` (a decoding sequence passes every length).

    Equal to :func:`kv_bytes` for plain dtypes (monotone in ``t``). KIVI bytes drop at each flush (``G``
    residual tokens become codes), so between flushes the bytes grow and the maximum is at ``tokens`` or just
    before a flush, at ``t = R + j*G - 1``. All layers flush together; while no window cap is crossed the bytes
    before successive flushes grow, so the candidates are ``tokens`` and the last pre-flush length below each
    window cap and below ``tokens`` (exact, checked against brute force in the tests).

    A capped cache (``keep_tokens`` N) holds the same bytes at every length from N on, so its peak is the
    peak at ``min(tokens, N)``.

    Raises:
        ValueError: as :func:`kv_bytes`.
    """
    kvd = _resolve(spec, kv)
    now = kv_bytes(spec, tokens, batch, kvd, tp=tp, mode=mode)
    if not kvd.is_kivi:
        return now
    tokens = kvd.kept(tokens)
    g, r = kvd.group_size, kvd.residual_length

    def last_flush(limit: int) -> int | None:  # largest R + j*G - 1 <= limit with j >= 1
        return r + (limit - r + 1) // g * g - 1 if limit >= r + g - 1 else None

    caps = set()
    if mode == "theoretical":
        caps = {
            spec.sliding_window if k == SLIDING else spec.attention_chunk_size
            for k in spec.layer_kinds
            if k in (SLIDING, CHUNKED)
        }
    limits = {tokens} | {min(tokens, c - 1) for c in caps}
    points = {t for t in map(last_flush, limits) if t is not None}
    return max([now] + [kv_bytes(spec, t, batch, kvd, tp=tp, mode=mode) for t in points])


def paged_kv_bytes(
    spec: ModelSpec,
    tokens: int,
    batch: int = 1,
    kv: str | KVDtype = "auto",
    *,
    block_size_tokens: int,
    tp: int = 1,
    mode: str = "theoretical",
) -> int:
    """Bytes of a paged cache (vLLM, arXiv:2309.06180 section 4.2): each layer's tokens rounded up to whole blocks of
    ``block_size_tokens`` per sequence. Plain dtypes only."""
    kvd = _resolve(spec, kv)
    if kvd.is_kivi:
        raise ValueError("paged_kv_bytes covers plain dtypes; KIVI has its own storage blocks")
    check_int_at_least("block_size_tokens", block_size_tokens, 1)
    total = 0
    for kind in spec.layer_kinds:
        if kind in KV_KINDS:
            t = kvd.kept(tokens_stored(spec, kind, tokens, mode))
            total += _layer_bytes(spec, kvd, -(-t // block_size_tokens) * block_size_tokens, tp)
    return total * batch


@dataclass(frozen=True)
class LedgerRow:
    """Bytes of one layer kind, on one GPU."""

    kind: str  # layer kind (kvlab.plan.config_fields.LAYER_KINDS)
    layers: int  # layers of this kind
    tokens_stored: int  # tokens one sequence keeps in one such layer (theoretical)
    tokens_allocated: int  # tokens an engine that reserves full length keeps
    bytes_per_token: float  # per sequence, all layers of this kind (KIVI: long-context figure)
    bytes_theoretical: int  # batch sequences, all layers of this kind
    bytes_allocated: int  # same, with full-length sliding/chunked layers


def _all_ranks(per_gpu: str) -> property:
    """A :class:`Ledger` property: its field ``per_gpu`` (one rank's bytes) summed over the ``tp`` ranks."""
    return property(lambda ledger: getattr(ledger, per_gpu) * ledger.tp, doc=f"``{per_gpu}`` x ``tp``.")


@dataclass(frozen=True)
class Ledger:
    """KV and weight bytes of a model serving ``batch`` sequences of ``context`` tokens on ``tp`` GPUs.

    ``*_per_gpu`` fields are one rank's; the others sum every rank (replicated heads and latents counted on
    each rank that holds them).
    """

    model: str  # ModelSpec.name
    kv_dtype: KVDtype
    context: int  # tokens per sequence
    batch: int  # sequences
    tp: int  # tensor-parallel ranks
    rows: tuple[LedgerRow, ...]  # one per layer kind present
    kv_bytes_per_token_per_gpu: float  # one new token, every layer within its window
    kv_bytes_total_per_gpu: int  # theoretical (window-capped)
    kv_bytes_allocated_per_gpu: int  # sliding/chunked layers at full length
    kv_bytes_peak_per_gpu: int  # most held at any length <= context (differs from total only for KIVI)
    kv_metadata_bytes_per_gpu: int  # of the theoretical total: KIVI scales/zeros or FP8 scales (0 for plain)
    weights: WeightBytes | None  # None when the config gives no parameter count and none was given
    notes: tuple[str, ...] = field(default=())

    kv_bytes_per_token = _all_ranks("kv_bytes_per_token_per_gpu")
    kv_bytes_total = _all_ranks("kv_bytes_total_per_gpu")
    kv_bytes_allocated = _all_ranks("kv_bytes_allocated_per_gpu")
    kv_metadata_bytes_total = _all_ranks("kv_metadata_bytes_per_gpu")

    @property
    def weight_bytes_per_gpu(self) -> int | None:
        """Weights split evenly over ranks (an approximation: norms and some embeddings are replicated)."""
        return None if self.weights is None else -(-self.weights.total_bytes // self.tp)

    @property
    def kv_to_weight_ratio(self) -> float | None:
        if self.weights is None or not self.weights.total_bytes:
            return None
        return self.kv_bytes_total / self.weights.total_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "kv_dtype": self.kv_dtype.to_dict(),
            "context": self.context,
            "batch": self.batch,
            "tp": self.tp,
            "kv_bytes_per_token": _num(self.kv_bytes_per_token),
            "kv_bytes_per_token_per_gpu": _num(self.kv_bytes_per_token_per_gpu),
            "kv_bytes_total": self.kv_bytes_total,
            "kv_bytes_total_allocated": self.kv_bytes_allocated,
            "kv_bytes_total_per_gpu": self.kv_bytes_total_per_gpu,
            "kv_bytes_allocated_per_gpu": self.kv_bytes_allocated_per_gpu,
            "kv_bytes_peak_per_gpu": self.kv_bytes_peak_per_gpu,
            "kv_metadata_bytes_per_gpu": self.kv_metadata_bytes_per_gpu,
            "kv_metadata_bytes_total": self.kv_metadata_bytes_total,
            "weight_bytes": None if self.weights is None else self.weights.total_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "weight_bytes_active": None if self.weights is None else self.weights.active_bytes,
            "weight_bytes_source": None if self.weights is None else self.weights.source,
            "kv_to_weight_ratio": self.kv_to_weight_ratio,
            "by_layer_kind": [
                {
                    "kind": r.kind,
                    "layers": r.layers,
                    "tokens_stored": r.tokens_stored,
                    "tokens_allocated": r.tokens_allocated,
                    "kv_bytes_per_token_per_gpu": _num(r.bytes_per_token),
                    "kv_bytes_theoretical_per_gpu": r.bytes_theoretical,
                    "kv_bytes_allocated_per_gpu": r.bytes_allocated,
                }
                for r in self.rows
            ],
            "notes": list(self.notes),
        }


def _num(x: float | int) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def build_ledger(
    spec: ModelSpec,
    context: int,
    batch: int,
    weights: WeightBytes | None,
    kv: str | KVDtype = "auto",
    *,
    tp: int = 1,
) -> Ledger:
    """The :class:`Ledger` of ``spec`` for ``batch`` sequences of ``context`` tokens (mechanics chapter [B]); with a
    capped ``kv`` (:func:`kv_dtype` ``keep_tokens``) each layer keeps ``min(its tokens, keep_tokens)``.

    Args:
        weights: the model's weight bytes (:func:`~kvlab.plan.weights.weight_bytes`) or None; kept in the ledger
            (its ``weight_bytes_per_gpu`` divides them by ``tp``). kv, tp: as :func:`kv_bytes`.

    Raises:
        ValueError: as :func:`kv_bytes` (``context`` or ``batch`` not an int >= 0, an unknown ``kv``, a bad ``tp``,
            KIVI on an MLA model).
    """
    kvd = _resolve(spec, kv)
    per_token_layer = kv_elements_per_token_per_layer(spec, tp) * kvd.bytes_per_element
    if kvd.is_kivi and spec.is_mla:
        raise ValueError("KIVI quantizes K per-channel and V per-token; an MLA latent has no K and V heads")
    rows = []
    for kind in dict.fromkeys(spec.layer_kinds):  # kinds in first-seen order
        n = spec.count(kind)
        stored = tokens_stored(spec, kind, context, "theoretical")
        allocated = tokens_stored(spec, kind, context, "allocated") if kind in KV_KINDS else 0
        stored, allocated = kvd.kept(stored), kvd.kept(allocated)  # an evicting cache's cap (keep_tokens)
        holds = kind in KV_KINDS
        rows.append(
            LedgerRow(
                kind=kind,
                layers=n,
                tokens_stored=stored,
                tokens_allocated=allocated,
                bytes_per_token=float(per_token_layer * n) if holds else 0.0,
                bytes_theoretical=_layer_bytes(spec, kvd, stored, tp) * n * batch if holds else 0,
                bytes_allocated=_layer_bytes(spec, kvd, allocated, tp) * n * batch if holds else 0,
            )
        )
    total = kv_bytes(spec, context, batch, kvd, tp=tp)
    assert total == sum(r.bytes_theoretical for r in rows)
    return Ledger(
        model=spec.name,
        kv_dtype=kvd,
        context=context,
        batch=batch,
        tp=tp,
        rows=tuple(rows),
        kv_bytes_per_token_per_gpu=kv_bytes_per_token(spec, kvd, tp),
        kv_bytes_total_per_gpu=total,
        kv_bytes_allocated_per_gpu=kv_bytes(spec, context, batch, kvd, tp=tp, mode="allocated"),
        kv_bytes_peak_per_gpu=kv_bytes_peak(spec, context, batch, kvd, tp=tp),
        kv_metadata_bytes_per_gpu=kv_metadata_bytes(spec, context, batch, kvd, tp=tp),
        weights=weights,
        notes=spec.notes,
    )
