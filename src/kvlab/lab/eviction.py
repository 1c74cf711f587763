"""``kvlab lab eviction``: attention sinks + window (StreamingLLM) against recomputing the window from scratch.

StreamingLLM (arXiv:2309.17453 section 3, Figure 3 and Table 1) compares, on text several times longer than the cache:

* **sliding window with re-computation**: every token is predicted from the last ``W`` tokens, their K/V
  recomputed from scratch (positions ``0..W-1``): quality of a window, cost ``O(W^2)`` per token;
* **window attention** (a KV cache keeping only the newest ``W`` tokens, here :class:`~kvlab.caches.sink.SinkCache`
  with 0 sinks): each kept token's K/V were computed when the first tokens were still visible; once those are
  evicted the attention has no "sink" to put its mass on;
* **StreamingLLM** (4 sinks + the newest ``W`` tokens, positions inside the cache).

:func:`measure_eviction` runs the three on ``tokens`` tokens of the bundled model's held-out text and reports the
mean next-token NLL (nats) over every prediction and over the predictions made once eviction has begun, with the
full-context NLL (one forward, nothing evicted) for scale and each cache's bytes, measured after the last token.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kvlab.caches.measure import cache_nbytes
from kvlab.caches.sink import SinkCache
from kvlab.lab import longrun
from kvlab.lab.exactness import incremental_chunks
from kvlab.lab.longrun import STEP_TOKENS, Progress, spans
from kvlab.runtime import provenance
from kvlab.runtime.checks import check_int
from kvlab.runtime.hf_api import cache_kwarg


@dataclass(frozen=True)
class EvictionConfig:
    """Settings of :func:`measure_eviction`.

    Raises:
        ValueError: a count below its minimum, ``tokens`` not above ``window_length + max(sink_tokens)``, or a
            repeated entry of ``sink_tokens`` (each value named).
    """

    tokens: int = (
        2048  # held-out tokens scored (StreamingLLM's point needs several windows: >= 4x the window)
    )
    window_length: int = 256  # W: newest tokens kept by the caches; the recompute baseline's context
    sink_tokens: tuple[int, ...] = (
        4,
        0,
    )  # one SinkCache run per value (StreamingLLM: 4; 0 = window attention)
    offset: int = 0  # first held-out token
    batch_windows: int = 32  # recompute baseline: windows per forward (memory vs speed; no effect on results)
    tolerance: float = 0.05  # check: NLL with sinks (> 0) within this fraction of the recompute baseline's

    def __post_init__(self) -> None:
        for name, low in (("tokens", 2), ("window_length", 1), ("offset", 0), ("batch_windows", 1)):
            check_int(name, getattr(self, name), low)
        sinks = tuple(self.sink_tokens)
        if not sinks or len(set(sinks)) != len(sinks):
            raise ValueError(f"`sink_tokens` must be distinct values, got {list(sinks)}")
        for s in sinks:
            check_int("sink_tokens", s, 0)  # each sink count
        if (
            isinstance(self.tolerance, bool)
            or not isinstance(self.tolerance, (int, float))
            or not (0 <= self.tolerance < math.inf)
        ):
            raise ValueError(f"`tolerance` must be a finite number >= 0, got {self.tolerance!r}")
        if self.tokens <= self.window_length + max(sinks):
            raise ValueError(
                f"`tokens` ({self.tokens}) must exceed `window_length` + the largest of `sink_tokens` "
                f"({self.window_length} + {max(sinks)} = {self.window_length + max(sinks)}): nothing would be evicted"
            )
        object.__setattr__(self, "sink_tokens", sinks)


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-prediction NLL (nats): ``logits [n, vocab]``, ``targets [n]`` -> ``[n]`` float32."""
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


SCORE_ROWS = (
    1024  # full-context positions whose logits exist at once: [SCORE_ROWS, vocab] float32, not [T, vocab]
)


@torch.no_grad()
def full_context_nll(model: Any, ids: torch.Tensor, rows: int = SCORE_ROWS) -> tuple[torch.Tensor, int]:
    """NLL of ``ids[1:]`` (``ids: [tokens]``) from one forward over the whole sequence, through a
    ``DynamicCache``: ``([tokens - 1] NLL, bytes the DynamicCache holds)``.

    The forward stops at the last hidden states ``[T, hidden]``; ``model.lm_head`` and the cross-entropy run on
    ``rows`` positions at a time, so the logits ``[T, vocab]`` (and cross_entropy's float32 copy, 4 GB at 10k
    tokens of a 49,152-token vocabulary) never exist whole. The chunks are balanced (``rows / 2`` to ``rows`` each,
    one chunk below ``rows``): a matmul of that many rows gives the same rows as the whole one (a handful of rows
    can take another BLAS path and differ in the last bit).
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    hidden = model.model(ids[None], **{cache_kwarg(model.model): cache}, use_cache=True).last_hidden_state[
        0, :-1
    ]
    pieces = -(
        -hidden.shape[0] // rows
    )  # balanced chunks of rows/2..rows: no small tail taking another BLAS path
    chunks = zip(hidden.tensor_split(pieces), ids[1:].tensor_split(pieces))
    return torch.cat([_nll(model.lm_head(h), t) for h, t in chunks]), cache_nbytes(
        cache
    )  # [<= rows, vocab] each


def _window_spans(tokens: int, window: int, batch_windows: int) -> list[tuple[int, int]]:
    """The recompute baseline's window starts ``[1, tokens - window)`` (window ``[s, s + W)`` predicts token
    ``s + W``) in spans of about :data:`~kvlab.lab.longrun.STEP_TOKENS`, a multiple of ``batch_windows`` (the
    forwards batch the same windows as one loop over every start would)."""
    size = max(batch_windows, STEP_TOKENS // batch_windows * batch_windows)
    return spans(1, max(tokens - window, 1), size)


@torch.no_grad()
def recompute_window_nll(
    model: Any, ids: torch.Tensor, window: int, batch_windows: int = 32, progress: Progress | None = None
) -> torch.Tensor:
    """NLL of ``ids[1:]`` with each token predicted from the last ``window`` tokens only, recomputed from scratch at
    positions ``0..window-1`` (StreamingLLM's "sliding window with re-computation"): ``[tokens - 1]``.

    Predictions with at most ``window`` tokens before them see their whole prefix (one forward gives them all).
    ``progress`` is called as each span of about :data:`~kvlab.lab.longrun.STEP_TOKENS` windows starts (the
    first with that forward).
    """
    report = progress or (lambda step: None)
    tokens = ids.shape[0]
    head = min(window, tokens - 1)
    out = []
    for i, (a, b) in enumerate(_window_spans(tokens, window, batch_windows)):
        scored = f"windows {a:,}-{b - 1:,} of {tokens - window - 1:,}" if b > a else "no window"
        report(f"recompute last {window}: {'prefix, ' if i == 0 else ''}{scored}")
        if i == 0:
            out.append(full_context_nll(model, ids[: head + 1])[0])  # targets 1..head
        for chunk in torch.arange(a, b).split(batch_windows) if b > a else ():
            windows = torch.stack([ids[s : s + window] for s in chunk.tolist()])  # [n, W]
            hidden = model.model(windows).last_hidden_state[:, -1]  # [n, hidden]: the last position is scored
            out.append(_nll(model.lm_head(hidden), ids[chunk + window]))
    return torch.cat(out)


@torch.no_grad()
def streaming_nll(
    model: Any,
    ids: torch.Tensor,
    cache: Any,
    prefill_tokens: int,
    progress: Progress | None = None,
    label: str = "streaming",
) -> tuple[torch.Tensor, dict]:
    """NLL of ``ids[1:]`` decoded through ``cache``: one prefill of ``prefill_tokens`` tokens (choose at most what
    the cache holds, so that nothing is evicted before streaming starts), then one token per forward
    (:func:`kvlab.lab.exactness.incremental_chunks`).
    ``progress`` is called as each span of :data:`~kvlab.lab.longrun.STEP_TOKENS` streamed tokens starts (the
    first with the prefill), named after ``label``.

    Returns:
        ``([tokens - 1] NLL, {"nbytes": bytes after the last token, "nbytes_max": the largest after any step})``.
    """
    tokens = ids.shape[0]
    nll, peak = [], 0
    for t, logits in incremental_chunks(model, ids[None], cache, prefill_tokens, progress, label):
        # position t + j predicts token t + j + 1; the last position predicts none
        n = min(logits.shape[1], tokens - 1 - t)
        nll.append(_nll(logits[0, :n], ids[t + 1 : t + 1 + n]))
        peak = max(peak, cache_nbytes(cache))
    return torch.cat(nll), {"nbytes": cache_nbytes(cache), "nbytes_max": peak}


def eviction_steps(config: EvictionConfig) -> int:
    """Steps :func:`measure_eviction` reports to ``progress``: the full-context forward, the recompute baseline's
    spans of windows, each sink run's spans of streamed tokens (:func:`~kvlab.lab.longrun.spans`)."""
    recompute = len(_window_spans(config.tokens, config.window_length, config.batch_windows))
    sinks = sum(len(spans(s + config.window_length, config.tokens)) for s in config.sink_tokens)
    return 1 + recompute + sinks


def peak_bytes(
    model_config: Any, config: EvictionConfig, dtype: torch.dtype, tokens: int | None = None
) -> int:
    """Bytes :func:`measure_eviction` allocates above the loaded model at its peak (``tokens``: instead of
    ``config.tokens``), estimated from ``model_config``'s shapes as ``kvlab lab --real`` does
    (:func:`kvlab.lab.longrun.activation_bytes`, :func:`~kvlab.lab.longrun.kv_bytes`). The largest of

    * the full-context forward: its activations over every token, the DynamicCache's K/V, the last hidden states
      ``[tokens, hidden]`` and one chunk of :data:`SCORE_ROWS` logits (in the dtype, float32 and cross_entropy's);
    * the recompute baseline: ``batch_windows`` windows of ``window_length`` tokens in one forward;
    * a sink run: the prefill of ``sinks + window_length`` tokens, its logits and the cache (counted twice: a
      ``torch.cat`` layer copies itself per token).
    """
    tokens = config.tokens if tokens is None else tokens
    shape = longrun.forward_shape(model_config)
    item = torch.empty((), dtype=dtype).element_size()
    vocab, hidden = shape["vocab"], shape["hidden"]
    full = (
        longrun.activation_bytes(model_config, tokens)
        + longrun.kv_bytes(model_config, tokens, item)
        + tokens * hidden * item
        + min(tokens, SCORE_ROWS) * vocab * (item + 8)
    )
    windows = config.batch_windows * config.window_length
    recompute = longrun.activation_bytes(model_config, windows) + config.batch_windows * vocab * (item + 8)
    held = max(config.sink_tokens) + config.window_length
    stream = (
        longrun.activation_bytes(model_config, held)
        + 2 * longrun.kv_bytes(model_config, held, item)
        + held * vocab * (item + 8)
    )
    return max(full, recompute, stream)


def memory_problem(model_config: Any, config: EvictionConfig, dtype: torch.dtype) -> str | None:
    """Why :func:`measure_eviction` would not fit in the available memory (:func:`peak_bytes` against
    :func:`kvlab.runtime.provenance.available_memory_bytes`), naming the tokens that would fit; None when it fits or the
    available memory is unknown."""
    available = provenance.available_memory_bytes()
    need = peak_bytes(model_config, config, dtype)
    if available is None or need <= available:
        return None
    low, high = 0, config.tokens  # the most tokens that fit: peak_bytes grows with them
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (
            (mid, high) if peak_bytes(model_config, config, dtype, mid) <= available else (low, mid - 1)
        )
    least = config.window_length + max(config.sink_tokens) + 1
    hint = f"at most about {low} tokens fit" if low >= least else "not even the window fits"
    what = f"`tokens` {config.tokens:,} (one forward over every token: its activations and the DynamicCache's K/V)"
    return longrun.memory_refusal(what, need, available, hint)


def _summary(nll: torch.Tensor, evict_from: int) -> dict:
    """Mean NLL over every prediction and over the targets at index >= ``evict_from`` (eviction has begun)."""
    tail = nll[evict_from - 1 :]  # nll[i] scores token i + 1
    return {
        "nll": float(nll.mean()),
        "nll_after_window": float(tail.mean()),
        "perplexity_after_window": math.exp(float(tail.mean())),
        "predictions": int(nll.numel()),
        "predictions_after_window": int(tail.numel()),
    }


def measure_eviction(
    model: Any, tokenizer: Any, config: EvictionConfig = EvictionConfig(), progress: Progress | None = None
) -> dict:
    """Run the full-context, recompute-window and sink + window measurements (see the module docstring).

    Args:
        model: a transformers causal LM with full-attention RoPE layers (``model.model``, ``model.lm_head``).
        tokenizer: its tokenizer (the held-out text is tokenized with it).
        config: :class:`EvictionConfig`.
        progress: called with a step's name as it starts (:func:`eviction_steps` steps).

    Returns:
        A JSON-ready dict: ``config``, ``model`` dtype, ``full_context``, ``recompute_window`` and ``sink`` rows
        (one per ``sink_tokens`` value, with ``nbytes``, ``nbytes_max``, ``nll_ratio_vs_recompute``), the
        ``dynamic_nbytes`` a DynamicCache holds at ``tokens`` tokens (measured), ``wall_s`` per method, and
        ``checks``: each run with sinks within ``tolerance`` of the recompute baseline (NLL after the window),
        every cache's bytes after the last token equal to its largest (flat once full); ``all_passed``.

    Raises:
        ValueError: a size whose :func:`peak_bytes` exceed the available memory (before any forward; the message
            says how many tokens fit), the held-out text is shorter than ``offset + tokens``; what
            :class:`SinkCache` raises.
    """
    from kvlab.models import heldout_token_ids

    problem = memory_problem(model.config, config, model.dtype)
    if problem:  # before any forward, as kvlab lab --real and kvlab inspect
        raise ValueError(problem)
    ids = torch.tensor(heldout_token_ids(tokenizer, config.tokens, config.offset), device=model.device)
    W = config.window_length
    evict_from = W + max(config.sink_tokens) + 1  # first target predicted after any cache evicted
    rows: dict[str, Any] = {}
    report = progress or (lambda step: None)
    report(f"full context: one forward of {config.tokens:,} tokens (DynamicCache)")
    t0 = time.perf_counter()
    full, dynamic_nbytes = full_context_nll(model, ids)
    rows["full_context"] = _summary(full, evict_from) | {"wall_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    base = recompute_window_nll(model, ids, W, config.batch_windows, report)
    rows["recompute_window"] = _summary(base, evict_from) | {"wall_s": time.perf_counter() - t0}
    sinks = []
    for s in config.sink_tokens:
        t0 = time.perf_counter()
        cache = SinkCache(s, W, config=model.config)
        nll, sizes = streaming_nll(model, ids, cache, s + W, report, f"SinkCache {s} sinks + {W}")
        row = {"sink_tokens": s, **_summary(nll, evict_from), **sizes, "held_tokens": cache.held_tokens()}
        row["nll_ratio_vs_recompute"] = row["nll_after_window"] / rows["recompute_window"]["nll_after_window"]
        row["wall_s"] = time.perf_counter() - t0
        sinks.append(row)
    checks = {
        f"sink{row['sink_tokens']}_within_tolerance": row["nll_ratio_vs_recompute"] <= 1 + config.tolerance
        for row in sinks
        if row["sink_tokens"] > 0
    }
    checks["bytes_flat_after_window"] = all(row["nbytes"] == row["nbytes_max"] for row in sinks)
    return {
        "config": asdict(config),
        "dtype": str(model.dtype).removeprefix("torch."),
        "evict_from_token": evict_from,
        **rows,
        "sink": sinks,
        "dynamic_nbytes": dynamic_nbytes,  # measured after the full-context forward
        "checks": checks,
        "all_passed": all(checks.values()),
    }
