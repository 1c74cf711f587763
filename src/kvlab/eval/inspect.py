"""The KV range report behind ``kvlab inspect``: per layer and KV head, what a model's keys and values look like to a
quantizer, measured on one prefill.

For each layer ``l`` and KV head ``h`` of the K/V a ``DynamicCache`` holds after a prefill of the prompt
(``[1, kv_heads, tokens, head_dim]``; keys after RoPE, as every cache stores them):

* **ranges** — abs-max and percentiles of ``|k|`` and ``|v|`` over tokens and channels;
* **per-channel outliers** — a channel's magnitude is its abs-max over tokens; ``channel_ratio`` is the largest
  channel magnitude over the median one, ``outlier_channels`` counts channels above ``outlier_factor`` x the
  median. Keys have a few such channels and values do not: the reason KIVI (arXiv:2402.02750 section 3.1, Fig. 2)
  quantizes keys per-channel and values per-token; values get the same statistic for contrast;
* **FP8** — for e4m3 and e5m2 (:mod:`kvlab.quant.fp8`), the fraction of K/V elements that would saturate (beyond
  the format's largest value after scaling) or flush to zero (non-zero, stored as zero), and the relative RMS
  error of the round trip, with scale 1.0 (an engine without calibration), a per-tensor scale (one per layer)
  and per-head scales. Calibrated scales are computed on the first ``calibrate_tokens`` tokens of the prompt
  (as :class:`kvlab.caches.fp8.FP8Cache` calibrates on its prefill) and applied to every token, so a later token
  beyond the calibrated range shows up as saturation;
* **FP8 key-side attention KL** — what the rounding of the keys does to attention itself: the prompt's last
  ``n`` queries (captured from the same prefill through kvlab attention's observers) attend over the keys before
  them, exactly and with the keys FP8-rounded (per-head scales, plain or Hadamard-rotated first:
  :mod:`kvlab.quant.rotation`), and the mean ``KL(softmax(q K^T s) || softmax(q K_fp8^T s))`` over the queries of
  each KV head's group is reported. A relative RMS error says nothing of this: a rotation keeps every element's
  relative error and still moves the scores far less when a few channels carry them.

Every number is computed here from the tensors of this run. The mechanics chapter's FP8 section motivates the
report: check the outliers before trusting "half the bytes".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvlab.quant.fp8 import FORMATS, calibrate, decode, encode
from kvlab.quant.rotation import hadamard

PERCENTILES = (50.0, 99.0, 99.9)
ATTENTION_QUERIES = 64  # the prompt's last queries whose attention over the earlier keys is compared
KEY_VARIANTS = ("per-head", "hadamard")  # FP8Cache(scale="per-head") and FP8Cache(..., rotation="hadamard")
FP8_SCALES = ("1.0", "per-tensor", "per-head")  # report keys; "1.0" is FP8Cache(scale="none")
_CACHE_SCALE = {"1.0": "none", "per-tensor": "per-tensor", "per-head": "per-head"}


def _ranges(x: torch.Tensor, percentiles: Sequence[float]) -> dict[str, float]:
    """``x``: ``[tokens, head_dim]`` -> abs-max and the percentiles of ``|x|``."""
    a = x.abs().flatten()
    q = torch.quantile(a, torch.tensor([p / 100 for p in percentiles], dtype=a.dtype))
    out = {"absmax": float(a.max())}
    out.update({f"p{p:g}": float(v) for p, v in zip(percentiles, q)})
    return out


def _channels(x: torch.Tensor, factor: float) -> dict[str, float | int]:
    """``x``: ``[tokens, head_dim]`` -> per-channel magnitude statistics (see the module docstring)."""
    mag = x.abs().amax(dim=0)  # [head_dim]: each channel's abs-max over tokens
    median = float(mag.median())
    if median == 0.0:
        return {"channel_ratio": float("inf") if float(mag.max()) > 0 else 1.0, "outlier_channels": 0}
    return {
        "channel_ratio": float(mag.max()) / median,
        "outlier_channels": int((mag > factor * median).sum()),
        "top_channel": int(mag.argmax()),
    }


def _fp8_cell(x: torch.Tensor, fmt: str, scale: torch.Tensor | None) -> dict[str, float]:
    """Saturated / flushed fractions and relative RMS error of one FP8 round trip of ``x`` (any shape)."""
    enc = encode(x, fmt, scale)
    n = x.numel()
    back = decode(enc.codes, scale, torch.float32)
    err = float((back - x).pow(2).sum().sqrt() / x.pow(2).sum().sqrt().clamp_min(1e-30))
    return {
        "saturated_fraction": int(enc.saturated) / n,
        "underflow_fraction": int(enc.underflow) / n,
        "rel_rms_error": err,
    }


def _scales(x: torch.Tensor, fmt: str, calibrate_tokens: int) -> dict[str, torch.Tensor | None]:
    """Report scale name -> scales for ``x`` ``[1, H, T, D]``, calibrated on its first ``calibrate_tokens``."""
    head = x[:, :, :calibrate_tokens]
    return {name: calibrate(head, fmt, _CACHE_SCALE[name]) for name in FP8_SCALES}


def inspect_kv(
    model: Any,
    input_ids: torch.Tensor,
    *,
    outlier_factor: float = 4.0,
    percentiles: Sequence[float] = PERCENTILES,
    calibrate_tokens: int | None = None,
) -> dict:
    """Per layer and KV head: K/V ranges, per-channel outliers and FP8 saturation/underflow after one prefill.

    Args:
        model: a transformers causal LM with full-attention layers (run on ``input_ids``' device).
        input_ids: ``[1, tokens]`` prompt ids (one sequence).
        outlier_factor: a channel is an outlier above this multiple of the median channel magnitude (> 1).
        percentiles: percentiles of ``|k|`` and ``|v|`` to report, each in ``(0, 100)``.
        calibrate_tokens: prompt tokens the calibrated FP8 scales see (default: the first half).

    Returns:
        A JSON-ready dict: ``tokens``, ``settings``, ``layers`` (one entry per layer: ``heads``, each with
        ``key``/``value`` ranges and channel statistics and ``fp8[format][scale]`` fractions for K and V together,
        plus the layer's worst key channel ratio and summed outlier channels), and ``fp8`` (fractions over the whole
        model, per format and scale).

    Raises:
        ValueError: ``input_ids`` not ``[1, tokens]`` with ``tokens >= 2``, ``outlier_factor <= 1``, a percentile
            outside ``(0, 100)``, ``calibrate_tokens`` outside ``[1, tokens]``, or a model whose cache holds no
            ``keys``/``values`` per layer.
    """
    tokens, percentiles, calibrate_tokens = _check_settings(
        input_ids, outlier_factor, percentiles, calibrate_tokens
    )
    from transformers import DynamicCache

    from kvlab.runtime.hf_api import cache_kwarg

    cache = DynamicCache()
    n_queries = min(ATTENTION_QUERIES, tokens // 2)
    observed = _observed_queries(model, n_queries)
    if tokens - n_queries < 2:  # one key before the last query: its weight is 1, exact or FP8 (a KL of 0, unmeasured)
        n_queries, note = 0, (
            f"a prompt of {tokens} tokens leaves one key before its last query, whose attention weight is 1 with "
            "exact or FP8 keys alike; at least 3 tokens are needed"
        )
        observed = contextlib.nullcontext(({}, note))
    with observed as (queries, note):
        with torch.no_grad():
            body = _model_body(model)  # no logits: inspect reads only the cache and the queries
            body(input_ids, use_cache=True, **{cache_kwarg(body): cache})
    layers = []
    for idx, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or keys.ndim != 4:
            raise ValueError(
                f"layer {idx} of the model's cache holds no [batch, kv_heads, tokens, head_dim] keys"
            )
        layers.append(
            _layer_report(idx, keys.float(), values.float(), outlier_factor, percentiles, calibrate_tokens)
        )
        if idx in queries:
            q, scale = queries[idx]
            kls = _key_attention_kl(q, scale, keys.float(), calibrate_tokens)
            for head, kl in zip(layers[-1]["heads"], kls):
                head["fp8_key_attention_kl"] = kl
    return {
        "tokens": tokens,
        "settings": {
            "outlier_factor": float(outlier_factor),
            "percentiles": list(percentiles),
            "calibrate_tokens": calibrate_tokens,
            "fp8_scales": list(FP8_SCALES),
            "scale_dtype": "float32",
            "attention_queries": n_queries,
        },
        "layers": layers,
        "fp8": _model_fp8(layers),
        "fp8_key_attention_kl": _model_attention_kl(layers, note),
    }


@contextlib.contextmanager
def _observed_queries(model: Any, n: int):
    """Yield ``(queries, note)`` around one forward: ``queries[layer] = ([Hq, n, D] fp32 last ``n`` query rows,
    softmax scale)`` filled by kvlab attention's observers (:class:`kvlab.attention.context.ForwardContext`), the model
    switched to kvlab attention for the forward and back after; ``note`` says why nothing is captured when the model
    cannot run it (the attention KL is then not measured)."""
    from kvlab.attention import context, interface

    queries: dict[int, tuple[torch.Tensor, float]] = {}
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    previous = getattr(model.config, "_attn_implementation", None)
    try:
        interface.enable(model)
    except Exception as exc:  # the ranges and FP8 fractions need no queries: report them without the KL
        yield queries, f"kvlab attention could not be enabled on this model ({type(exc).__name__}: {exc})"
        return

    def keep(idx: int):
        def observe(query: torch.Tensor, key: torch.Tensor, scaling: float | None) -> None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            queries[idx] = (query[0, :, -n:].detach().float(), float(scale))

        return observe

    try:
        with (
            context.forward_context() as ctx
        ):  # the model's forward joins it: the observers are set before it runs
            for idx in range(int(getattr(config, "num_hidden_layers", 0) or 0)):
                ctx.observers[idx] = keep(idx)
            yield queries, None
    finally:
        if previous is not None:
            model.set_attn_implementation(previous)


def _key_attention_kl(q: torch.Tensor, scale: float, k: torch.Tensor, calibrate_tokens: int) -> list[dict]:
    """Per KV head of one layer: ``{format: {variant: mean KL}}`` of the attention of the last queries ``q``
    ``[Hq, n, D]`` over the keys before them (``k`` ``[1, H, T, D]`` fp32, the first ``T - n``), exact against
    FP8-rounded keys with per-head scales calibrated on the first ``calibrate_tokens`` (capped to those keys)."""
    heads, n = k.shape[1], q.shape[1]
    history = k[0, :, : k.shape[2] - n]  # [H, T - n, D]
    group = q.shape[0] // heads  # query heads per KV head (GQA)
    cal = max(1, min(calibrate_tokens, history.shape[1]))
    d = k.shape[-1]
    rotation = hadamard(d) if d & (d - 1) == 0 else None
    out = []
    for h in range(heads):
        qh = q[h * group : (h + 1) * group]  # [g, n, D]
        exact = torch.log_softmax(qh @ history[h].T * scale, dim=-1)  # [g, n, T - n]
        cells: dict[str, dict[str, float | None]] = {}
        for fmt in FORMATS:
            cells[fmt] = {}
            for variant in KEY_VARIANTS:
                r = rotation if variant == "hadamard" else None
                if variant == "hadamard" and r is None:
                    cells[fmt][variant] = None  # not a power-of-two head_dim: the cache refuses it too
                    continue
                x = history[h] if r is None else history[h] @ r
                s = calibrate(x[None, None, :cal], fmt, "per-head")[0, 0]
                back = decode(encode(x, fmt, s).codes, s, torch.float32)
                back = back if r is None else back @ r.T
                approx = torch.log_softmax(qh @ back.T * scale, dim=-1)
                cells[fmt][variant] = float((exact.exp() * (exact - approx)).sum(-1).mean())
        out.append(cells)
    return out


def _model_attention_kl(layers: list[dict], note: str | None) -> dict:
    """Mean and max over every KV head of :func:`_key_attention_kl`, per format and variant (``note`` when none)."""
    cells = [
        h["fp8_key_attention_kl"] for layer in layers for h in layer["heads"] if "fp8_key_attention_kl" in h
    ]
    if not cells:
        return {"measured": False, "note": note or "no layer's queries were observed"}
    out: dict[str, Any] = {"measured": True}
    for fmt in FORMATS:
        out[fmt] = {}
        for variant in KEY_VARIANTS:
            values = [c[fmt][variant] for c in cells if c[fmt][variant] is not None]
            out[fmt][variant] = {"mean": sum(values) / len(values), "max": max(values)} if values else None
    return out


def _check_settings(input_ids, outlier_factor, percentiles, calibrate_tokens) -> tuple[int, tuple, int]:
    """``(tokens, percentiles, calibrate_tokens)`` after the checks :func:`inspect_kv` documents."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"`input_ids` must be [1, tokens], got {tuple(getattr(input_ids, 'shape', ()))}")
    tokens = input_ids.shape[1]
    if tokens < 2:
        raise ValueError(f"the prompt needs at least 2 tokens, got {tokens}")
    if (
        isinstance(outlier_factor, bool)
        or not isinstance(outlier_factor, (int, float))
        or not outlier_factor > 1
    ):
        raise ValueError(f"`outlier_factor` must be a number > 1, got {outlier_factor!r}")
    percentiles = tuple(percentiles)
    bad = [p for p in percentiles if not (isinstance(p, (int, float)) and 0 < p < 100)]
    if bad or not percentiles:
        raise ValueError(f"percentiles must be numbers in (0, 100), got {list(percentiles)}")
    calibrate_tokens = tokens // 2 if calibrate_tokens is None else calibrate_tokens
    ok = isinstance(calibrate_tokens, int) and not isinstance(calibrate_tokens, bool)
    if not ok or not 1 <= calibrate_tokens <= tokens:
        raise ValueError(f"`calibrate_tokens` must be an int in [1, {tokens}], got {calibrate_tokens!r}")
    return tokens, percentiles, calibrate_tokens


def _head_fp8(kh, vh, h, scales) -> dict:
    """FP8 cells of one head (``kh``/``vh`` ``[T, D]``): format -> scale -> K and V together, plus each one's error."""
    out: dict[str, dict] = {}
    for fmt in FORMATS:
        out[fmt] = {}
        for name in FP8_SCALES:
            ks, vs = scales[fmt][0][name], scales[fmt][1][name]  # [1, H or 1, 1, 1] or None
            ks = None if ks is None else ks[0, min(h, ks.shape[1] - 1)]
            vs = None if vs is None else vs[0, min(h, vs.shape[1] - 1)]
            kc, vc = _fp8_cell(kh, fmt, ks), _fp8_cell(vh, fmt, vs)
            both = {key: (kc[key] + vc[key]) / 2 for key in ("saturated_fraction", "underflow_fraction")}
            both.update(key_rel_rms_error=kc["rel_rms_error"], value_rel_rms_error=vc["rel_rms_error"])
            out[fmt][name] = both
    return out


def _layer_report(idx, k, v, outlier_factor, percentiles, calibrate_tokens) -> dict:
    """One layer's entry of :func:`inspect_kv` from its fp32 ``k``/``v`` ``[1, H, T, D]``."""
    scales = {fmt: (_scales(k, fmt, calibrate_tokens), _scales(v, fmt, calibrate_tokens)) for fmt in FORMATS}
    heads = []
    for h in range(k.shape[1]):
        kh, vh = k[0, h], v[0, h]  # [T, D]
        heads.append(
            {
                "head": h,
                "key": {**_ranges(kh, percentiles), **_channels(kh, outlier_factor)},
                "value": {**_ranges(vh, percentiles), **_channels(vh, outlier_factor)},
                "elements": kh.numel(),
                "fp8": _head_fp8(kh, vh, h, scales),
            }
        )
    return {
        "layer": idx,
        "key_channel_ratio_max": max(c["key"]["channel_ratio"] for c in heads),
        "value_channel_ratio_max": max(c["value"]["channel_ratio"] for c in heads),
        "key_outlier_channels": sum(c["key"]["outlier_channels"] for c in heads),
        "value_outlier_channels": sum(c["value"]["outlier_channels"] for c in heads),
        "key_absmax": max(c["key"]["absmax"] for c in heads),
        "value_absmax": max(c["value"]["absmax"] for c in heads),
        "heads": heads,
    }


def _model_fp8(layers: list[dict]) -> dict:
    """Model-wide FP8 fractions: every head's K/V cells weighted by its elements."""
    out = {}
    for fmt in FORMATS:
        out[fmt] = {}
        for name in FP8_SCALES:
            cells = [(h["fp8"][fmt][name], h["elements"]) for layer in layers for h in layer["heads"]]
            n = sum(e for _, e in cells)
            out[fmt][name] = {
                key: sum(c[key] * e for c, e in cells) / n if n else 0.0
                for key in ("saturated_fraction", "underflow_fraction")
            }
    return out


def peak_bytes(config: Any, *, tokens: int, dtype: torch.dtype) -> int:
    """Bytes :func:`inspect_kv` allocates above the loaded model at its peak for a ``tokens`` prompt, from
    ``config``'s shapes: the prefill's activations (``[tokens, 32 hidden + 8 intermediate]`` float32, as
    :func:`kvlab.lab.exactness.peak_bytes` counts them), the ``DynamicCache``'s K/V in ``dtype`` (every layer's, kept
    to the end) and one layer's K/V in float32 eight times over (the copies, FP8 codes and round trips of the
    per-layer statistics). No logits: the prefill stops at the last hidden states. The attention KL's scores are
    ``[queries, tokens]`` per head with 64 queries, which the activations' term covers."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    heads = int(getattr(cfg, "num_attention_heads", None) or 1)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    item = torch.empty((), dtype=dtype).element_size()
    layer_kv = 2 * kv_heads * head_dim * tokens  # elements of one layer's K and V
    return tokens * (32 * hidden + 8 * inter) * 4 + layers * layer_kv * item + 8 * layer_kv * 4


def _model_body(lm: Any) -> Any:
    """The decoder without its LM head (``lm.model``) when it has one, so that no ``[tokens, vocab]`` logits are
    made: the K/V and the observed queries are the same; else ``lm`` itself."""
    body = getattr(lm, "model", None)
    return body if isinstance(body, torch.nn.Module) and hasattr(lm, "lm_head") else lm


def inspect_model(
    model: str | None = None,
    *,
    tokens: int = 2048,
    offset: int = 0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    prompt: str | None = None,
    before_forward: Callable[[Any, int], None] | None = None,
    **kwargs: Any,
) -> dict:
    """Load ``model`` as ``kvlab eval`` does (:func:`kvlab.models.load_model`; None = the bundled model), cut the
    prompt and run :func:`inspect_kv`; the result carries the model's provenance and the prompt's source.

    Args:
        model: None (bundled), a local directory or a hub id.
        tokens: prompt length in tokens, cut from the bundled held-out text at ``offset`` (ignored with ``prompt``).
        prompt: text to use instead of the held-out text (tokenized without special tokens).
        before_forward: called with the loaded model and the prompt's length once the prompt is cut, before any
            forward (``kvlab inspect``'s memory check: it raises ValueError to refuse).
        dtype, device: as ``kvlab eval``'s ``--dtype`` / ``--device``.
        kwargs: passed to :func:`inspect_kv`.

    Raises:
        ValueError / FileNotFoundError / OSError: as :func:`kvlab.models.load_model`,
            :func:`kvlab.models.heldout_token_ids`, ``before_forward`` and :func:`inspect_kv`.
    """
    from kvlab.eval.model_info import describe_model
    from kvlab.models import heldout_token_ids, load_model

    lm, tokenizer = load_model(model, dtype=dtype, device=device)
    if prompt is not None:
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        source = {"source": "--prompt", "tokens": len(ids)}
    else:
        ids = heldout_token_ids(tokenizer, tokens, offset=offset)
        source = {"source": "kvlab.models.heldout_text()", "tokens": tokens, "offset": offset}
    if before_forward is not None:
        before_forward(lm, len(ids))
    input_ids = torch.tensor([ids], device=lm.device)
    out = inspect_kv(lm, input_ids, **kwargs)
    return {"model": describe_model(lm, model, dtype, device), "prompt": source, **out}
