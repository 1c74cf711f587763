"""The quantization chapter's paired experiment: every cache candidate against ``DynamicCache`` on the same model.

Two matrices: **capacity** (contexts x candidates at a fixed residual window) and **residual window** (one context,
longer generation, residuals R x candidates). Each cell records latency (median/min over ``repeat`` generate()
calls), the exact cache bytes and their ratio to the float cache, incremental peak memory, fixed-continuation NLL
and its delta/ratio to the baseline, mean top-k overlap, greedy agreement and first divergence. A candidate that
fails is recorded with its stage, exception type and message, and the rest still run. The decision follows seed
000 §5.4: eligible rows pass every gate and save memory; the selected row saves the most bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from kvlab.caches import cache_nbytes
from kvlab.caches.registry import REGISTRY
from kvlab.eval.candidates import Candidate, check_model_shape
from kvlab.eval.config import EvalConfig, Gates
from kvlab.eval.divergence import kl_divergence, kl_summary
from kvlab.eval.longctx import (
    NotMeasurable,
    build_passkey_probe,
    build_recall_probe,
    encode_heldout,
    fill_cache,
    long_context_fields,
    measure_long_context,
    prefill_states,
)
from kvlab.eval.metrics import (
    compare_outputs,
    fixed_continuation,
    generate_once,
    run_generate,
    topk_overlap,
)
from kvlab.eval.render import BUNDLED_ID, BYTE_TIE
from kvlab.eval.schema import SCHEMA_VERSION
from kvlab.runtime.device import resolve_device, synchronize  # resolve_device re-exported: kvlab eval uses it
from kvlab.runtime.dtypes import SLOW_DTYPE_RATIO, cpu_matmul_policy, float32_attention
from kvlab.runtime.provenance import hardware_info, software_info  # re-exported: provenance of a run
from kvlab.runtime.timing import default_threads, interleaved, paired_ratio
from kvlab.runtime.workers import SplitJobs, resolve_workers

Progress = Callable[[str], None]


def describe_model(model: Any, model_arg: str | None, dtype: str, device: str) -> dict:
    """Provenance of the model: id or path, content fingerprint (or resolved commit), source (kind; for a GGUF or
    named model the package, its version, the GGUF sha256 and what the weights are), architecture summary."""
    from kvlab.models import model_fingerprint, model_source, reference_model_path

    path = str(reference_model_path()) if model_arg is None else model_arg
    text = model.config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    source = model_source(model_arg)
    return {
        "id_or_path": BUNDLED_ID if model_arg is None else model_arg,
        "path": path,
        "fingerprint": model_fingerprint(path),
        "source": {"kind": source.kind, **source.provenance},
        "dtype": dtype,
        "device": device,
        "architecture": type(model).__name__,
        "num_layers": text.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def plan_cells(cfg: EvalConfig) -> list[dict]:
    """Every (matrix, candidate, context, residual) cell the run will measure, baseline included."""
    cells = []
    for ctx in cfg.contexts:
        for name in cfg.candidates:
            cells.append(
                {
                    "matrix": "capacity",
                    "candidate": name,
                    "context_length": ctx,
                    "new_tokens": cfg.new_tokens,
                    "residual_length": cfg.residual_length,
                    "group_size": cfg.group_size,
                }
            )
    if cfg.window_residuals:
        cells.append(
            {
                "matrix": "window",
                "candidate": "dynamic",
                "context_length": cfg.window_context,
                "new_tokens": cfg.window_new_tokens,
                "residual_length": None,
                "group_size": None,
            }
        )
        for i, r in enumerate(cfg.window_residuals):
            for name in cfg.candidates:
                # a cache without a residual window runs once (the window matrix varies only R)
                if name != "dynamic" and (i == 0 or Candidate.parse(name).uses_residual):
                    cells.append(
                        {
                            "matrix": "window",
                            "candidate": name,
                            "context_length": cfg.window_context,
                            "new_tokens": cfg.window_new_tokens,
                            "residual_length": r if Candidate.parse(name).uses_residual else None,
                            "group_size": cfg.window_group_size,
                        }
                    )
    return cells


def new_result(cfg: EvalConfig, label: str, argv: list[str] | None) -> dict:
    """Result skeleton: schema, settings, gates, candidates, planned cells; status ``planned``."""
    cands = []
    for name in cfg.candidates:
        c = Candidate.parse(name)
        d = c.describe(cfg.residual_length, cfg.group_size, cfg.hqq_group_size, cfg.kivi_attention)
        reason = c.unavailable_reason()
        d.update({"available": reason is None, "skip_reason": reason})
        cands.append(d)
    return {
        "schema_version": SCHEMA_VERSION,
        "label": label,
        "status": "planned",
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": ["kvlab", *argv] if argv is not None else None,
        "settings": cfg.to_dict(),
        "gates": cfg.gates.__dict__.copy(),
        "candidates": cands,
        "plan": plan_cells(cfg),
        "provenance": {"software": software_info()},
        "cells_done": [],  # {matrix, context_length} of each finished cell, in the order they finished
        "rows": [],
        "failures": [],
        "summary": None,
        "elapsed_s": None,
    }


def build_prompts(
    cfg: EvalConfig, tokenizer: Any, context: int, device: torch.device
) -> tuple[torch.Tensor, dict]:
    """``[batch, context]`` prompt ids and their description (mode, source, sha256 of the ids)."""
    if cfg.prompt_mode == "repeat":
        ids = tokenizer(cfg.prompt, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id]
        row = (ids * (context // len(ids) + 1))[:context]
        rows = [row] * cfg.batch
        source = {"mode": "repeat", "prompt_sha256": hashlib.sha256(cfg.prompt.encode()).hexdigest()}
    else:
        from kvlab.models import heldout_text, heldout_token_ids

        total = len(tokenizer(heldout_text(), add_special_tokens=False, verbose=False)["input_ids"])
        if total < context:
            raise ValueError(
                f"the held-out text has {total} tokens under this tokenizer, fewer than context {context}"
            )
        rng = random.Random(f"{cfg.seed}-{context}")  # deterministic, different per context
        offsets = [rng.randrange(0, total - context + 1) for _ in range(cfg.batch)]
        rows = [heldout_token_ids(tokenizer, context, offset=o) for o in offsets]
        source = {
            "mode": "heldout",
            "source": "kvlab.models.heldout_text()",
            "offsets": offsets,
            "heldout_tokens": total,
        }
    tensor = torch.tensor(rows, dtype=torch.long)
    source["ids_sha256"] = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
    source["context_length"] = context
    return tensor.to(device), source


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


class _Cell:
    """Runs one candidate on one prompt; failures are recorded, not raised."""

    def __init__(self, cfg, model, pad_id, result, progress):
        self.cfg, self.model, self.pad_id, self.result, self.progress = cfg, model, pad_id, result, progress

    def measure(
        self,
        cand: Candidate,
        ids,
        new_tokens,
        residual,
        group,
        continuation,
        base,
        cpu_memory: bool = True,
        matrix: str | None = None,
    ) -> dict | None:
        """The untimed measurement of one cache (outputs, bytes, peak memory, quality), or None when it failed
        (recorded in ``failures`` with ``matrix``, the cell's matrix)."""
        cfg, stage = self.cfg, "construct"
        try:

            def make():
                return cand.make(self.model.config, residual, group, cfg.hqq_group_size, cfg.kivi_attention)

            make()
            stage = "generate"
            # one call for the outputs, bytes and peak memory (it also warms this cache up for the timed rounds);
            # the timed calls come later, interleaved with the other caches of the cell (time_paired)
            perf, cache, generated = run_generate(
                self.model, ids, make, new_tokens, max(0, cfg.warmup - 1), 0, self.pad_id, cpu_memory
            )
            stage = "cache_bytes"
            row = {
                "make": make,
                "perf": perf,
                "cache_bytes": cache_nbytes(cache),
                "cache_tokens": int(ids.shape[1] + new_tokens - 1),
            }
            if hasattr(cache, "nbytes_breakdown"):
                row["cache_bytes_breakdown"] = cache.nbytes_breakdown()
            if callable(
                getattr(cache, "counts", None)
            ):  # FP8: elements saturated / flushed to zero when stored
                row["cache_counts"] = cache.counts()
            del cache
            if continuation is not None:
                stage = "quality"
                row["quality"] = self.quality(make, ids, continuation, base)
            row["generated"] = generated
            return row
        except Exception as exc:  # a failed candidate is recorded and the run goes on
            self.result["failures"].append(
                {
                    "matrix": matrix,
                    "candidate": cand.name,
                    "context_length": int(ids.shape[1]),
                    "residual_length": residual,
                    "stage": stage,
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "traceback_tail": traceback.format_exc().splitlines()[-3:],
                }
            )
            self.progress(f"[red]{cand.name} failed at {stage}: {type(exc).__name__}: {exc}")
            return None

    def quality(self, make, ids, continuation, base: dict | None) -> dict:
        """:func:`fixed_continuation` of a fresh cache from ``make``, filled from the baseline's float prefill of
        the same prompt when the cache takes it (:func:`fill_cache`: its prefill attends with float K/V, so it
        would compute the same one); a cache that scores its prompt itself (SnapKV) or refuses the fill runs its
        own prefill."""
        cache = make()
        shared = (base or {}).get("quality") or {}
        prefilled = None
        if shared.get("prefill_states") is not None and not getattr(cache, "needs_own_prefill", False):
            try:
                fill_cache(cache, shared["prefill_states"])
                prefilled = {"logits": shared["prefill_logits"], "prefill_ms": shared["prefill_ms"]}
            except ValueError:
                cache = make()
        q = fixed_continuation(self.model, ids, continuation, cache, self.cfg.top_k, prefilled=prefilled)
        q.pop("prefill_states", None)  # only the baseline's are kept, until its cell is measured
        q.pop("prefill_logits", None)
        return q

    def time_paired(
        self,
        ids,
        new_tokens: int,
        entries: list[tuple[str, str, int | None, dict]],
        matrix: str | None = None,
    ) -> None:
        """Time every measured cache of one cell interleaved (:func:`kvlab.runtime.timing.interleaved`,
        ``cfg.repeat`` rounds, order rotated per round) and write the timings into each ``meas["perf"]``; each
        candidate also gets ``meas["paired"]`` (its ratio to the baseline from same-round pairs) and every entry
        ``meas["contention"]``. ``entries``: ``(key, candidate name, residual, meas)``, the baseline first. A cache
        that fails here is recorded in ``failures`` (with ``matrix``, the cell's) and dropped from the cell (its
        ``meas`` gets ``"failed"``).
        """
        device = ids.device
        live = list(entries)
        failed: list[str] = []  # keys whose call raised, latest last

        def call(key, make):
            def run():
                try:
                    generate_once(self.model, ids, make, new_tokens, self.pad_id)
                    synchronize(device)
                except Exception:
                    failed.append(key)
                    raise

            return run

        while live:
            calls = {key: call(key, meas["make"]) for key, _, _, meas in live}
            try:
                with torch.inference_mode():
                    timings, cont = interleaved(calls, self.cfg.repeat, threads=torch.get_num_threads())
            except Exception as exc:  # recorded; the other caches of the cell are timed again without it
                bad = next(e for e in live if e[0] == failed[-1]) if failed else live[0]
                self.result["failures"].append(
                    {
                        "matrix": matrix,
                        "candidate": bad[1],
                        "context_length": int(ids.shape[1]),
                        "residual_length": bad[2],
                        "stage": "timing",
                        "type": type(exc).__name__,
                        "message": str(exc),
                    }
                )
                bad[3]["failed"] = True
                if bad is live[0]:  # the baseline: nothing left to pair with
                    for e in live:
                        e[3]["failed"] = True
                    return
                live.remove(bad)
                continue
            base_ms = timings[live[0][0]]
            for key, _, _, meas in live:
                t, perf = timings[key], meas["perf"]
                median = statistics.median(t)
                perf.update(
                    {
                        "median_ms": median,
                        "min_ms": min(t),
                        "timings_ms": t,
                        "ms_per_token": median / max(1, perf["generated_tokens"]),
                    }
                )
                meas["contention"] = cont
                if key != live[0][0]:
                    meas["paired"] = paired_ratio(t, base_ms)
            return


def _group_size(cand, residual, group, cfg) -> int | None:
    """The group size a candidate's cache quantizes with (its registry ``describe``), or ``None`` without groups."""
    if cand.family == "dynamic":
        return None
    return cand.describe(residual, group, cfg.hqq_group_size).get("group_size")


def _row(matrix, cand, ctx, new_tokens, residual, group, meas, base, cfg) -> dict:
    perf, q = meas["perf"], meas.get("quality")
    row = {
        "matrix": matrix,
        "candidate": cand.name,
        "family": cand.family,
        "nbits": cand.nbits,
        "context_length": ctx,
        "new_tokens": new_tokens,
        "residual_length": residual if cand.uses_residual else None,
        # the group size the cache uses (KIVI's G, HQQ/quanto's), None for caches without groups (dynamic, fp8)
        "group_size": _group_size(cand, residual, group, cfg),
        "median_ms": perf["median_ms"],
        "min_ms": perf["min_ms"],
        "timings_ms": perf["timings_ms"],
        "timing_spread": _spread(perf["timings_ms"]),
        "ms_per_token": perf["ms_per_token"],
        "incremental_peak_bytes": perf["incremental_peak_bytes"],
        "peak_memory_method": perf.get("peak_memory_method"),
        "cache_tokens": meas["cache_tokens"],
        "cache_bytes": meas["cache_bytes"],
        "cache_bytes_breakdown": meas.get("cache_bytes_breakdown"),
        "cache_counts": meas.get("cache_counts"),
        "timing_contention": meas.get("contention"),
        "latency_trusted": not (meas.get("contention") or {}).get("busy", False),
    }
    if q is not None:
        row.update(
            {
                "mean_nll": q["mean_nll"],
                "prefill_ms": q["prefill_ms"],
                "prefill_shared": q.get("prefill_shared", False),
                "decode_ms": q["decode_ms"],
            }
        )
    if meas.get("long_context"):
        row.update(
            long_context_fields(meas["long_context"], None if base is None else base.get("long_context"))
        )
    if base is not None:
        bperf, bq = base["perf"], base.get("quality")
        row["dynamic_cache_bytes"] = base["cache_bytes"]
        row["cache_bytes_ratio"] = meas["cache_bytes"] / base["cache_bytes"]
        row["cache_bytes_saved"] = base["cache_bytes"] - meas["cache_bytes"]
        paired = meas.get("paired")
        if paired is not None:  # same-round pairs of the interleaved timing (kvlab.runtime.timing)
            row["latency_ratio"] = paired["ratio"]
            row["latency_ratio_min"], row["latency_ratio_max"] = paired["min"], paired["max"]
            row["latency_ratio_unpaired"] = paired["unpaired"]
        else:
            row["latency_ratio"] = perf["median_ms"] / bperf["median_ms"]
        bp, cp = bperf["incremental_peak_bytes"], perf["incremental_peak_bytes"]
        row["incremental_peak_saved_bytes"] = None if bp is None or cp is None else bp - cp
        row["incremental_peak_reduction_ratio"] = None if not bp or cp is None else 1.0 - cp / bp
        if q is not None and bq is not None:
            row["nll_delta"] = q["mean_nll"] - bq["mean_nll"]
            row["nll_ratio"] = q["mean_nll"] / max(1e-9, bq["mean_nll"])
            row["topk_overlap"] = topk_overlap(bq["topk_ids"], q["topk_ids"], cfg.top_k)
            if q["decode_ms"] and bq["decode_ms"]:
                row["decode_latency_ratio"] = q["decode_ms"] / bq["decode_ms"]
            if q.get("logits") is not None and bq.get("logits") is not None:  # llama.cpp's --kl-divergence
                row.update(kl_summary(kl_divergence(bq["logits"], q["logits"])))
        row.update(compare_outputs(base["generated"], meas["generated"]))
        row["gates"] = apply_gates(row, cfg.gates)
        if not row["latency_trusted"]:  # the verdict would rest on a busy machine's timings: not used
            row["gates"]["latency_ratio"] = None
        row["eligible"] = all(v for v in row["gates"].values() if v is not None)
    return row


def apply_gates(row: dict, gates: Gates) -> dict[str, bool]:
    """Judge one candidate row against the acceptance gates (quantization chapter §5.4).

    A gate passes on its boundary: ``nll_delta <= max_nll_delta`` (nats per token, candidate minus float cache),
    ``topk_overlap >= min_topk_overlap`` (fraction in [0, 1]), ``latency_ratio <= max_latency_ratio`` (median
    ``generate()`` ms, candidate / float cache); ``saves_memory`` needs ``cache_bytes_saved > 0`` (bytes, float
    cache minus candidate). A quality metric that is missing or ``None`` (the quality stage did not run) or NaN
    fails its gate. A row is eligible for the decision when every gate passes.

    Args:
        row: a paired row of :func:`run_eval` (or a hand-made dict with the same keys): ``latency_ratio`` and
            ``cache_bytes_saved`` required, ``nll_delta`` and ``topk_overlap`` optional.
        gates: the thresholds.

    Returns:
        ``{"nll_delta": bool, "topk_overlap": bool, "latency_ratio": bool, "saves_memory": bool}``, in that order,
        followed by the :func:`long_context_gates` that apply to the row.

    Raises:
        TypeError: ``gates`` is not a :class:`~kvlab.eval.config.Gates`.
        ValueError: ``row`` lacks ``latency_ratio`` or ``cache_bytes_saved`` (the baseline row has neither).
    """
    if not isinstance(gates, Gates):
        raise TypeError(f"`gates` must be a kvlab.eval.config.Gates, got {type(gates).__name__}")
    missing = [k for k in ("latency_ratio", "cache_bytes_saved") if row.get(k) is None]
    if missing:
        raise ValueError(
            f"row of candidate {row.get('candidate')!r} at context {row.get('context_length')!r} has no {missing}: "
            f"only a row paired with the float-cache baseline can be gated"
        )
    nll, topk = row.get("nll_delta"), row.get("topk_overlap")
    verdicts = {
        "nll_delta": nll is not None and nll <= gates.max_nll_delta,
        "topk_overlap": topk is not None and topk >= gates.min_topk_overlap,
        "latency_ratio": row["latency_ratio"] <= gates.max_latency_ratio,
        "saves_memory": row["cache_bytes_saved"] > 0,
    }
    verdicts.update(long_context_gates(row, gates))
    return verdicts


# long-context gates: (gate name = row key, threshold attribute of Gates); each is an upper bound
LONG_CONTEXT_GATES = (
    ("recall_drop", "max_recall_drop"),
    ("passkey_drop", "max_passkey_drop"),
    ("kl_mean", "max_kl_mean"),
)


def long_context_gates(row: dict, gates: Gates) -> dict[str, bool]:
    """The long-context gates of one paired row: ``recall_drop <= max_recall_drop`` (copy accuracy lost at the
    worst distance, fraction), ``passkey_drop <= max_passkey_drop`` (passkey accuracy lost, mean over depths,
    fraction) and ``kl_mean <= max_kl_mean`` (nats per position). A gate applies only when its key is in the row:
    a context too short for the recall span, one without the passkey grid, or a row whose quality stage did not
    run has no key and no verdict. A key that is present but None or NaN fails.

    Args:
        row: a paired row (or a hand-made dict) with any of ``recall_drop``, ``passkey_drop``, ``kl_mean``.
        gates: the thresholds.

    Returns:
        ``{gate: passed}`` for each gate that applies, in :data:`LONG_CONTEXT_GATES` order.

    Raises:
        TypeError: ``gates`` is not a :class:`~kvlab.eval.config.Gates`.
    """
    if not isinstance(gates, Gates):
        raise TypeError(f"`gates` must be a kvlab.eval.config.Gates, got {type(gates).__name__}")
    out = {}
    for key, attr in LONG_CONTEXT_GATES:
        if key in row:
            value = row[key]
            out[key] = value is not None and value <= getattr(gates, attr)
    return out


# timed calls of one cell differing by more than this (max / min) make its latency, and a decision resting on the
# latency gate, untrustworthy: the machine was busy with something else
UNSTABLE_TIMING_SPREAD = 1.5
NEAR_GATE = (
    0.10  # a latency ratio this close (relative) to its gate, timed once, can land on either side of it
)


def _spread(timings: list[float]) -> float | None:
    """max / min of a cell's timed calls (None for fewer than two)."""
    if len(timings) < 2 or min(timings) <= 0:
        return None
    return max(timings) / min(timings)


def latency_warning(rows: list[dict], max_latency_ratio: float | None = None) -> str | None:
    """A warning when the machine was busy while capacity cells were timed (``latency_trusted`` false: their
    latency gate was not used), when a cell's timed calls disagree by more than :data:`UNSTABLE_TIMING_SPREAD`, or
    when a candidate cell timed only once (``--repeat 1``, ``--quick``'s default) has a latency ratio within
    :data:`NEAR_GATE` of ``max_latency_ratio`` (its verdict, and so the decision, can change between runs); else
    None."""
    cap = [r for r in rows if r["matrix"] == "capacity"]
    parts = []
    near = [
        r
        for r in cap
        if max_latency_ratio
        and r["candidate"] != "dynamic"
        and len(r.get("timings_ms") or ()) == 1
        and r.get("latency_ratio") is not None
        and (r.get("gates") or {}).get("latency_ratio") is not None
        and abs(r["latency_ratio"] / max_latency_ratio - 1) <= NEAR_GATE
    ]
    if near:
        cells = ", ".join(
            f"{r['candidate']} at {r['context_length']} ({r['latency_ratio']:.2f}x)" for r in near
        )
        parts.append(
            f"timed once (--repeat 1), {cells} {'is' if len(near) == 1 else 'are'} within {NEAR_GATE:.0%} of the "
            f"latency gate ({max_latency_ratio:g}x): that verdict, and the decision, can change from run to run; "
            f"use --repeat 3 or more to decide on latency"
        )
    busy = sorted({r["context_length"] for r in cap if r.get("latency_trusted") is False})
    if busy:
        reason = next(
            (r["timing_contention"] or {}).get("reason")
            for r in cap
            if r.get("latency_trusted") is False and r.get("timing_contention")
        )
        parts.append(
            f"the machine was busy while timing context(s) {', '.join(map(str, busy))} ({reason}): latency not "
            f"trusted there, the latency gate was not used and the decision rests on the memory and quality gates "
            f"(the ratios shown are paired per round, so still indicative)"
        )
    spread = [r for r in cap if r.get("timing_spread") is not None]
    bad = [r for r in spread if r["timing_spread"] > UNSTABLE_TIMING_SPREAD]
    if bad:
        worst = max(bad, key=lambda r: r["timing_spread"])
        parts.append(
            f"{len(bad)} of {len(spread)} capacity cells had timed calls differing by more than "
            f"{UNSTABLE_TIMING_SPREAD}x (worst: {worst['candidate']} at {worst['context_length']}, "
            f"{worst['timing_spread']:.1f}x): medians are noisy; rerun on a quiet machine or with a larger --repeat"
        )
    return "; ".join(parts) or None


def decide(rows: list[dict]) -> tuple[dict | None, str]:
    """The decision of the quantization chapter §5.4 over gated candidate rows.

    Among the rows with ``eligible`` true (every gate of :func:`apply_gates` passed), select the one that saves
    the most cache bytes. Rows saving within :data:`BYTE_TIE` (1 %) of the most are a tie (``fp8-e5m2-unscaled``
    saves an FP8 cache's 64 B of scales more than ``fp8-e4m3`` and once won on them with 14x its KL); a tie goes to
    the lower mean KL to the float cache (``kl_mean``, nats: caches of the same size, e.g. ``fp8-e4m3`` and
    ``fp8-e4m3-hadamard``, differ in quality, and one timed round's latency noise once picked the one 4.6x further
    from the float model), then to the lower latency ratio, then to the more bytes saved, then to the earlier row.

    Args:
        rows: candidate rows (the baseline and window-matrix rows are the caller's to leave out), each with
            ``eligible``; eligible rows also need ``cache_bytes_saved`` (bytes), ``latency_ratio``, ``candidate``
            and ``context_length`` (tokens).

    Returns:
        ``(selected_row, decision)``: ``(row, "accept <candidate> at context <context_length>")``, or
        ``(None, "tune_cache_policy")`` when no row is eligible.

    Raises:
        ValueError: a row has no ``eligible`` field (it was never gated).
    """
    ungated = [i for i, r in enumerate(rows) if "eligible" not in r]
    if ungated:
        raise ValueError(
            f"rows at positions {ungated} have no 'eligible' field: gate them with apply_gates first"
        )
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        return None, "tune_cache_policy"
    most = max(r["cache_bytes_saved"] for r in eligible)
    tied = [r for r in eligible if r["cache_bytes_saved"] >= most - BYTE_TIE * abs(most)]
    selected = max(tied, key=lambda r: (-_kl_or_inf(r), -r["latency_ratio"], r["cache_bytes_saved"]))
    return selected, f"accept {selected['candidate']} at context {selected['context_length']}"


def _kl_or_inf(row: dict) -> float:
    """``row["kl_mean"]``, or +inf where it was not measured (a row with a KL wins a byte tie over one without)."""
    kl = row.get("kl_mean")
    return kl if isinstance(kl, (int, float)) and kl == kl else float("inf")


# the fields of the selected row that the summary carries
SELECTED_KEYS = (
    "candidate",
    "context_length",
    "residual_length",
    "group_size",
    "cache_bytes",
    "cache_bytes_ratio",
    "cache_bytes_saved",
    "nll_delta",
    "nll_ratio",
    "topk_overlap",
    "latency_ratio",
    "incremental_peak_saved_bytes",
)


def summarize(result: dict) -> dict:
    """Onset, eligible crossover, selected candidate and decision (quantization chapter §5.4), from capacity rows.

    Only capacity-matrix rows of non-baseline candidates count; the residual-window matrix is a diagnostic.

    Args:
        result: a result dict with ``rows`` (each with ``matrix``, ``candidate``, ``context_length`` in tokens,
            ``cache_bytes_saved`` in bytes and, for candidates, ``eligible``, ``latency_ratio`` and the
            :data:`SELECTED_KEYS`).

    Returns:
        ``memory_reduction_onset_context`` (smallest context whose row saves bytes, or None),
        ``eligible_crossover_context`` (smallest context with an eligible row, or None),
        ``eligible_candidate_count`` (eligible capacity rows), ``per_candidate`` (the same per candidate, with
        ``eligible_contexts``), ``selected_candidate`` (the :data:`SELECTED_KEYS` of :func:`decide`'s row, or None),
        ``decision``, ``decision_gates`` (the gates the selected row was judged on: the latency gate is left out
        where the machine was busy while timing), ``latency_trusted`` (no capacity cell was timed on a busy
        machine) and the warnings shown next to the decision (``latency_warning``, ``long_context_warning``,
        ``long_context_not_measured``, ``eviction_warning``, ``dtype_warning``; each None when it does not apply),
        and ``failed_candidates`` (:func:`failed_everywhere`: requested candidates the decision could not judge).

    Raises:
        ValueError: from :func:`decide`, a capacity candidate row that was never gated.
    """
    rows = [r for r in result["rows"] if r["matrix"] == "capacity" and r["candidate"] != "dynamic"]
    rows.sort(key=lambda r: r["context_length"])
    selected, decision = decide(rows)
    per_candidate = {}
    for name in sorted({r["candidate"] for r in rows}):
        mine = [r for r in rows if r["candidate"] == name]
        per_candidate[name] = {
            "memory_reduction_onset_context": next(
                (r["context_length"] for r in mine if r["cache_bytes_saved"] > 0), None
            ),
            "eligible_crossover_context": next((r["context_length"] for r in mine if r["eligible"]), None),
            "eligible_contexts": [r["context_length"] for r in mine if r["eligible"]],
        }
    return {
        "memory_reduction_onset_context": next(
            (r["context_length"] for r in rows if r["cache_bytes_saved"] > 0), None
        ),
        "eligible_crossover_context": next((r["context_length"] for r in rows if r["eligible"]), None),
        "eligible_candidate_count": sum(1 for r in rows if r["eligible"]),
        "per_candidate": per_candidate,
        "selected_candidate": {k: selected.get(k) for k in SELECTED_KEYS} if selected else None,
        "decision": decision,
        "decision_gates": None
        if selected is None
        else [k for k, v in selected["gates"].items() if v is not None],
        "latency_trusted": all(r.get("latency_trusted", True) for r in rows),
        "latency_warning": latency_warning(
            result["rows"], (result.get("gates") or {}).get("max_latency_ratio")
        ),
        "long_context_warning": long_context_warning(result["rows"]),
        "long_context_not_measured": not_measured_warning(result),
        "eviction_warning": eviction_warning(selected),
        "dtype_warning": dtype_warning(result),
        "failed_candidates": failed_everywhere(result),
    }


def failed_everywhere(result: dict) -> list[dict]:
    """The candidates that ran (not skipped as unavailable) but failed in every capacity cell, so that the decision,
    which reads capacity rows only, left them out: ``[{"candidate", "stage", "type", "message"}]``, the first
    failure of each. A run with any is not a clean result (``kvlab eval`` exits 1)."""
    measured = {r["candidate"] for r in result.get("rows", []) if r.get("matrix") == "capacity"}
    out = []
    for cand in result.get("candidates", []):
        name = cand.get("name")
        if name in measured or not cand.get("available", True):
            continue
        first = next((f for f in result.get("failures", []) if f.get("candidate") == name), None)
        if first is not None:
            out.append({"candidate": name, **{k: first.get(k) for k in ("stage", "type", "message")}})
    return out


def dtype_warning(result: dict) -> str | None:
    """A warning when the run's model dtype was emulated on its CPU: ``provenance.hardware.
    matmul_time_ratio_vs_float32`` (measured at the start of the run by :func:`kvlab.runtime.dtypes.
    matmul_time_ratio`) above :data:`SLOW_DTYPE_RATIO`; else None (float32, a GPU, a native bf16 CPU, or an older
    result without the measurement).

    With ``provenance.hardware.cpu_matmul`` ``"float32"`` (``--cpu-matmul auto``'s choice there) it says the Linear
    layers ran as float32 GEMMs on the dtype's values; otherwise (``native``, or an older result) that prefill and
    the long-context probes set the run time and latencies describe torch's emulation of the dtype.
    """
    provenance = result.get("provenance") or {}
    hardware = provenance.get("hardware") or {}
    ratio = hardware.get("matmul_time_ratio_vs_float32")
    if ratio is None or ratio <= SLOW_DTYPE_RATIO:
        return None
    dtype = (
        (provenance.get("model") or {}).get("dtype") or (result.get("settings") or {}).get("dtype") or "model"
    )
    capability = hardware.get("cpu_capability")
    where = f" (torch's CPU capability: {capability})" if capability else ""
    head = (
        f"on this CPU a {dtype} matmul took {ratio:.1f}x the time of a float32 one{where}: it has no native {dtype} "
        f"matrix instructions"
    )
    if hardware.get("cpu_matmul") == "float32":
        attention = (
            " and ran its attention (SDPA) in float32"
            if hardware.get("float32_attention", True)
            else f" (its attention stayed {dtype}: {hardware.get('float32_attention_note')})"
        )
        return (
            f"{head}, so this run multiplied the model's Linear layers as float32 GEMMs on {dtype} values{attention}, "
            f"outputs rounded to {dtype} (--cpu-matmul native: torch's own {dtype} kernels); latencies describe that "
            f"path, not a CPU that serves {dtype} natively"
        )
    if hardware.get("cpu_matmul_note"):  # auto kept the native kernels: the float32 copies would not fit
        return (
            f"{head}, so prefill and the long-context probes set the run time, and latencies describe emulated "
            f"{dtype}; {hardware['cpu_matmul_note']}"
        )
    return (
        f"{head}, so prefill and the long-context probes set the run time, and latencies describe emulated "
        f"{dtype}; --cpu-matmul auto (float32 GEMMs on {dtype} values) or --dtype float32 runs faster here (a "
        f"float32 model's float cache holds 4-byte elements, so the quantized caches' byte savings read twice as "
        f"large)"
    )


def not_measured_warning(result: dict) -> str | None:
    """A warning naming the probes that did not fit a context (``provenance.long_context.not_measured``): their
    gates do not apply to that context's rows, so a decision there rests on the other gates only; else None."""
    missing = ((result.get("provenance") or {}).get("long_context") or {}).get("not_measured") or []
    if not missing:
        return None
    where = ", ".join(f"{m['probe']} at {m['context_length']}" for m in missing)
    return (
        f"long-context probes not measured ({where}): their gates do not apply to those rows; the first reason: "
        f"{missing[0]['reason']}"
    )


# an evicting cache holding at least this share of the float cache's bytes dropped (almost) nothing in that cell
EVICTION_UNTESTED_RATIO = 0.9


def eviction_warning(selected: dict | None) -> str | None:
    """A warning when the selected row is an evicting cache (registry ``evicts``: sink, SnapKV, TOVA) that kept at
    least :data:`EVICTION_UNTESTED_RATIO` of the float cache's bytes (``cache_bytes_ratio``) in its cell: its budget
    held (almost) the whole prompt there, so the gates saw nothing of what it drops at longer prompts; else None.

    Args:
        selected: the capacity row :func:`decide` selected (``candidate``, ``family``, ``context_length`` in
            tokens, ``cache_bytes_ratio``), or None.
    """
    if selected is None:
        return None
    entry = REGISTRY.get(selected.get("family", ""))
    ratio = selected.get("cache_bytes_ratio")
    if entry is None or not entry.evicts or ratio is None or ratio < EVICTION_UNTESTED_RATIO:
        return None
    return (
        f"the selected {selected['candidate']} is an evicting cache that kept {ratio:.2f}x the float cache's bytes "
        f"at {selected['context_length']} tokens: its budget held (almost) the whole prompt, so the gates did not "
        f"see what it drops; judge it at a context longer than its budget (--contexts)"
    )


# below this accuracy of the float cache itself, the recall / passkey gates cannot tell caches apart
MIN_BASELINE_ACCURACY = 0.5


def long_context_warning(rows: list[dict]) -> str | None:
    """A warning when the float cache's own recall or passkey accuracy is below :data:`MIN_BASELINE_ACCURACY` in
    a capacity cell (the model does not use its context there, so a cache that loses it costs nothing measurable
    and the recall/passkey gates pass vacuously), else None."""
    base = [r for r in rows if r["matrix"] == "capacity" and r["candidate"] == "dynamic"]
    weak = [
        f"{key.split('_')[0]} {r[key]:.2f} at {r['context_length']}"
        for r in base
        for key in ("recall_accuracy", "passkey_accuracy")
        if r.get(key) is not None and r[key] < MIN_BASELINE_ACCURACY
    ]
    if not weak:
        return None
    return (
        f"the float cache itself scores {', '.join(weak)} (below {MIN_BASELINE_ACCURACY}): this model does not use "
        f"its context there, so the recall/passkey gates cannot reject a cache that loses distant tokens"
    )


class _LongContext:
    """The recall / passkey probes of each context (built once, cheaply) and their shared float prefill (computed
    where a probe job first needs it: this process or a helper).

    The probed text is kept out of the newest ``protected_tail`` tokens, the largest residual window plus group
    size of either matrix (a KIVI cache holds up to ``R + G - 1`` newest tokens in the model dtype), so the same
    probe serves both matrices at a shared context.
    """

    def __init__(self, cfg: EvalConfig, model: Any, tokenizer: Any, result: dict):
        self.cfg, self.model, self.tokenizer, self.result = cfg, model, tokenizer, result
        tails = [cfg.residual_length + cfg.group_size]
        if cfg.window_residuals:
            tails.append(max(cfg.window_residuals) + cfg.window_group_size)
        self.protected_tail = max(tails)
        self._heldout: list[int] | None = None
        self._probes: dict[tuple[str, int], Any] = {}  # (kind, context) -> Probe, or None when not measurable
        self._states: tuple[tuple[str, int], Any] | None = (
            None  # the latest prefill only (its memory is large)
        )
        self._prompt_info: dict[tuple[str, int], dict] = {}
        self.info = {
            "protected_tail_tokens": self.protected_tail,
            "passkey_contexts": list(cfg.passkey_contexts()),
            "not_measured": [],
        }
        result["provenance"]["long_context"] = self.info

    def _heldout_ids(self) -> list[int]:
        if self._heldout is None:
            from kvlab.models import heldout_text

            self._heldout = encode_heldout(self.tokenizer, heldout_text())
        return self._heldout

    def kinds(self, matrix: str, ctx: int) -> list[str]:
        """The probes of one cell (:func:`_probe_kinds`)."""
        return _probe_kinds(self.cfg, matrix, ctx)

    def probe(self, kind: str, ctx: int):
        """The probe of ``kind`` at ``ctx`` (built on first use), or None when the context is too short for it (then
        recorded in ``provenance.long_context.not_measured``, not a failure)."""
        if (kind, ctx) in self._probes:
            return self._probes[(kind, ctx)]
        cfg = self.cfg
        try:
            if kind == "recall":
                probe = build_recall_probe(
                    self._heldout_ids(),
                    ctx,
                    protected_tail=self.protected_tail,
                    rows_per_distance=cfg.recall_rows,
                    span_tokens=cfg.recall_span_tokens,
                    fractions=cfg.recall_fractions,
                    seed=cfg.seed,
                )
            else:
                probe = build_passkey_probe(
                    self.tokenizer,
                    self._heldout_ids(),
                    ctx,
                    protected_tail=self.protected_tail,
                    trials=cfg.passkey_trials,
                    depths=cfg.passkey_depths,
                    seed=cfg.seed,
                )
        except NotMeasurable as exc:
            self.info["not_measured"].append({"probe": kind, "context_length": ctx, "reason": str(exc)})
            probe = None
        else:
            self._prompt_info[(kind, ctx)] = {"mode": kind, **probe.info, "prefill_ms": None}
            self.result["provenance"]["prompts"].append(self._prompt_info[(kind, ctx)])
        self._probes[(kind, ctx)] = probe
        return probe

    def built(self) -> dict[tuple[str, int], Any]:
        """``{(kind, context): Probe}`` of the probes built so far (the measurable ones)."""
        return {k: p for k, p in self._probes.items() if p is not None}

    def states(self, kind: str, ctx: int) -> tuple[Any, float | None]:
        """``(states, prefill_ms)``: the float prefill of the probe's prompts (:func:`prefill_states`); computed
        here unless it is the one this process computed last (then ``prefill_ms`` is None)."""
        if self._states is not None and self._states[0] == (kind, ctx):
            return self._states[1], None
        self._states = None  # free the previous prefill before computing the next one
        probe = self._probes[(kind, ctx)]
        start = time.perf_counter()
        states = prefill_states(self.model, probe.prompt_ids.to(next(self.model.parameters()).device))
        self._states = ((kind, ctx), states)
        return states, (time.perf_counter() - start) * 1000.0

    def prefill_done(self, kind: str, ctx: int, prefill_ms: float) -> None:
        """Record a prefill's time in the probe's prompt entry (the first process to compute it)."""
        entry = self._prompt_info[(kind, ctx)]
        if entry["prefill_ms"] is None:
            entry["prefill_ms"] = prefill_ms

    def drop_states(self) -> None:
        """Free the float prefill this process computed last."""
        self._states = None

    def failed(self, matrix: str, ctx: int, error: dict) -> None:
        """Record that the float cache's probes failed in the ``matrix`` cell at ``ctx`` (its candidates skip them)."""
        self.result["failures"].append(
            {
                "matrix": matrix,
                "candidate": "dynamic",
                "context_length": ctx,
                "residual_length": None,
                "stage": "long_context",
                **error,
            }
        )


@dataclass(frozen=True)
class _ProbeJob:
    """One cache's probe of one kind at one context; ``key`` is shared by identical jobs of both matrices (the
    float cache at a context both use)."""

    kind: str
    ctx: int
    cand: Candidate
    residual: int
    group: int
    key: tuple


def check_against_model(cfg: EvalConfig, model: Any) -> None:
    """Settings only the loaded model can refute, checked before any cell runs.

    Raises:
        ValueError: ``top_k`` (--top-k) larger than the model's vocabulary (the top-k overlap would fail in the
            first cell, after the model load, as ``selected index k out of range``); a KIVI group size
            (--group-size, --window-group-size) or HQQ/quanto group size (--hqq-group-size) the model's head_dim
            and KV heads refute (:func:`kvlab.eval.candidates.check_model_shape`: every cell of those candidates
            would fail at generate).
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and cfg.top_k > vocab:
        raise ValueError(f"`top_k` (--top-k) {cfg.top_k} exceeds the model's vocabulary ({vocab:,} tokens)")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if not isinstance(head_dim, int) and isinstance(heads, int) and heads > 0:
        head_dim = getattr(config, "hidden_size", 0) // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not (isinstance(head_dim, int) and isinstance(kv_heads, int) and head_dim > 0 and kv_heads > 0):
        return  # not a decoder config this check can read: the cells say what fails
    groups = [("group_size", cfg.group_size, (cfg.residual_length,))]
    prompts = tuple(cfg.contexts)
    if cfg.window_residuals:
        groups.append(("window_group_size", cfg.window_group_size, tuple(cfg.window_residuals)))
        prompts += (cfg.window_context,)
    check_model_shape(cfg.candidates, head_dim, kv_heads, groups, cfg.hqq_group_size, prompts)


def context_limit_warnings(cfg: EvalConfig, model: Any) -> list[str]:
    """Warnings for cells whose prompt + new tokens pass the model's ``max_position_embeddings`` (run, not refused:
    a RoPE model extrapolates, but its quality numbers there describe positions it was never trained on)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return []
    cells = [(c, cfg.new_tokens) for c in cfg.contexts]
    if cfg.window_residuals:
        cells.append((cfg.window_context, cfg.window_new_tokens))
    over = sorted({c + n for c, n in cells if c + n > limit})
    if not over:
        return []
    return [
        f"{len(over)} cell length(s) (prompt + new tokens: {', '.join(f'{t:,}' for t in over)}) pass the model's "
        f"max_position_embeddings ({limit:,}): those rows measure positions it was not trained on"
    ]


def run_eval(
    cfg: EvalConfig,
    model: Any,
    tokenizer: Any,
    result: dict,
    model_info: dict,
    progress: Progress = lambda msg: None,
    advance: Callable[[], None] = lambda: None,
    notify: Callable[[str], None] = lambda msg: None,
) -> dict:
    """Run both matrices and fill ``result`` (from :func:`new_result`) in place; returns it.

    ``model`` must already be on its device in ``cfg.dtype``. Rows hold JSON-ready numbers only. Torch runs with
    ``cfg.threads`` threads (recorded as ``provenance.torch_threads``); the caller's setting is restored after.
    The run has two phases: every cell's untimed measurements (outputs, bytes, peak memory, quality here; the
    long-context probes shared with ``cfg.workers - 1`` forked helpers, :class:`kvlab.runtime.workers.SplitJobs`),
    then every cell's caches timed together, interleaved (:meth:`_Cell.time_paired`), with the helpers gone.

    A cell is finished once it is timed and its rows are in ``result["rows"]`` (or once its baseline failed):
    then it is listed in ``result["cells_done"]``, and ``advance`` is called, where ``kvlab eval`` saves the file.
    A cell already listed there when the run starts (a run resumed by :func:`kvlab.eval.resume.prepare_resume`)
    is kept as it is, rows and failures, and not measured again; every other cell is measured from the start
    (its untimed measurements hold tensors that are not saved). Rows come out in cell order and the summary is
    computed over all of them, as in an uninterrupted run.

    ``progress`` names the step starting, ``advance`` marks it done, ``notify`` gets a warning the user should see
    before the run's minutes are spent (today: :func:`dtype_warning`; it is in the summary too).

    Raises:
        ValueError: ``cfg.workers`` > 1 on a GPU run.
    """
    threads = cfg.threads if cfg.threads is not None else default_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    result["provenance"]["torch_threads"] = threads
    try:
        return _run_matrices(cfg, model, tokenizer, result, model_info, progress, advance, notify)
    finally:
        torch.set_num_threads(previous)  # the caller's process keeps its own setting


def _run_matrices(cfg, model, tokenizer, result, model_info, progress, advance, notify) -> dict:
    """The body of :func:`run_eval`, with its thread count set."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    workers = resolve_workers(cfg.workers, torch.get_num_threads(), device.type)
    torch.manual_seed(cfg.seed)
    result["provenance"].update(
        {"hardware": hardware_info(device), "model": model_info, "seed": cfg.seed, "argv": sys.argv}
    )
    # on a CPU without native bf16/fp16 matrix instructions the model dtype itself sets the run's pace: measure it,
    # multiply in float32 GEMMs there (--cpu-matmul auto), and say so before the first cell
    record, gemms = cpu_matmul_policy(model, cfg.cpu_matmul, device)
    result["provenance"]["hardware"].update(record)
    warning = dtype_warning(result)
    if warning:
        notify(warning)
    with gemms:
        return _run_cells(cfg, model, tokenizer, result, progress, advance, t0, workers)


def _cells(cfg: EvalConfig) -> list[tuple[str, int, int, list[int], int]]:
    """``(matrix, context, new_tokens, residuals, group)`` of every cell, in run order."""
    cells = [("capacity", ctx, cfg.new_tokens, [cfg.residual_length], cfg.group_size) for ctx in cfg.contexts]
    if cfg.window_residuals:
        cells.append(
            (
                "window",
                cfg.window_context,
                cfg.window_new_tokens,
                list(cfg.window_residuals),
                cfg.window_group_size,
            )
        )
    return cells


def cell_keys(cfg: EvalConfig) -> list[tuple[str, int]]:
    """``(matrix, context)`` of every cell, in run order: what names a cell in ``result["cells_done"]``."""
    return [cell[:2] for cell in _cells(cfg)]


def kept_cells(result: dict) -> frozenset[tuple[str, int]]:
    """The cells ``result["cells_done"]`` lists as finished, ``(matrix, context)``: :func:`run_eval` keeps their rows
    and failures and measures them no more (empty for a new result; an older result without the list)."""
    return frozenset((c["matrix"], c["context_length"]) for c in result.get("cells_done") or ())


def _cell_caches(runnable: list[Candidate], residuals: list[int]) -> list[tuple[Candidate, int]]:
    """The candidates a cell measures with their residual: a cache without a residual window runs once per cell
    (the window matrix varies only R)."""
    return [(c, r) for r in residuals for c in runnable if c.uses_residual or r == residuals[0]]


def _run_cells(cfg, model, tokenizer, result, progress, advance, t0: float, workers: int = 1) -> dict:
    """Both matrices, after the run's hardware checks (:func:`_run_matrices`)."""
    device = next(model.parameters()).device
    earlier_prompts = result["provenance"].get("prompts") or []  # a resumed run's, from its earlier session
    result["provenance"]["prompts"] = []
    result.setdefault("cells_done", [])
    _enable_attention(cfg, model, result)
    result["status"] = "running"
    # one untimed generate so that one-time costs (kernels, allocator) do not land on the first timed cell
    warm_ids, _ = build_prompts(cfg, tokenizer, min(64, min(cfg.contexts)), device)
    dynamic = Candidate.parse("dynamic")
    run_generate(model, warm_ids, lambda: dynamic.make(model.config, 0, 1), 4, 0, 1, _pad_id(tokenizer))
    run = _Matrix(cfg, model, tokenizer, result, progress, advance)
    cells = _cells(cfg)
    kept = kept_cells(result)
    jobs = run.probe_jobs(cells, kept)
    workers, memory_note = _fit_workers(cfg, model, run.long_ctx, workers)
    with SplitJobs([run.job(j) for j in jobs], workers, run.probe_done(jobs)) as split:
        measured = []
        for cell in cells:
            if cell[:2] in kept:  # finished in an earlier session: its rows and failures are in `result`
                run.keep(*cell)
                measured.append(None)
            else:
                measured.append(run.measure(*cell, split.poll))
        if jobs:
            split.poll()
            helped = (
                " (this process takes them from the back, the helper from the front)" if workers > 1 else ""
            )
            progress(f"long-context probes: {len(jobs) - len(split.outcomes)} of {len(jobs)} left{helped}")
        outcomes = split.finish()
    if run.long_ctx is not None:
        run.long_ctx.drop_states()  # the last prefill computed here
        _record_workers(run.long_ctx.info, split, workers, memory_note, progress)
        _carry_prefill_ms(earlier_prompts, result["provenance"]["prompts"])
    run.attach_probes(measured, jobs, outcomes)
    for cell in measured:  # every timed round after the helpers are gone
        if cell is not None:
            run.time(cell)
    # a resumed run's rows in an uninterrupted run's order (the kept cells' first, then the others')
    order = {cell[:2]: i for i, cell in enumerate(cells)}
    result["rows"].sort(key=lambda r: order.get((r["matrix"], r["context_length"]), len(order)))
    result["summary"] = summarize(result)
    result["status"] = "complete" if not result["failures"] else "partial"
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def _enable_attention(cfg: EvalConfig, model: Any, result: dict) -> None:
    """kvlab attention on ``model`` where a candidate or float32 attention needs it (recorded in provenance)."""
    # fused KIVI reads packed codes, SnapKV the prefill's queries; every other cache falls back to SDPA, unchanged
    # except that with float32 GEMMs it runs in float32 too (kvlab.runtime.dtypes.float32_attention)
    needed = any(Candidate.parse(n).uses_kvlab_attention(cfg.kivi_attention) for n in cfg.candidates)
    if needed or float32_attention():
        from kvlab.attention import enable

        try:
            enable(model)
        except Exception as exc:  # only float32 attention wanted it: the model keeps its own attention
            if needed:
                raise
            result["provenance"]["hardware"]["float32_attention"] = False
            result["provenance"]["hardware"]["float32_attention_note"] = (
                f"kvlab attention could not be enabled on this model ({type(exc).__name__}: {exc}): its attention "
                f"ran in the model dtype"
            )
    result["provenance"]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)


def _record_workers(info: dict, split: SplitJobs, workers: int, memory_note: str | None, progress) -> None:
    """How the probes were shared out, in ``provenance.long_context`` (``info``)."""
    info["workers"] = workers  # each helper computes with one torch thread
    if memory_note:
        info["workers_note"] = memory_note
    if split.helper_failures:
        info["helper_failures"] = split.helper_failures
        progress(
            f"[yellow]a helper process exited early (exit codes {split.helper_failures}); "
            "its probes ran in this process"
        )
    if split.reran:
        info["probes_rerun_here"] = len(split.reran)


def _carry_prefill_ms(earlier: list[dict], prompts: list[dict]) -> None:
    """A resumed run computes no probe prefill for the cells it kept: their prompt entries take ``prefill_ms``
    from the same entry of the earlier session (``earlier``), where there is one."""

    def key(entry: dict) -> str:  # the entry but its time, as JSON (the earlier one was read back from JSON)
        return json.dumps({k: v for k, v in entry.items() if k != "prefill_ms"}, sort_keys=True, default=str)

    times = {
        key(e): e["prefill_ms"] for e in earlier if isinstance(e, dict) and e.get("prefill_ms") is not None
    }
    for entry in prompts:
        if "prefill_ms" in entry and entry["prefill_ms"] is None:
            entry["prefill_ms"] = times.get(key(entry))


def _fit_workers(
    cfg: EvalConfig, model: Any, long_ctx: _LongContext | None, workers: int
) -> tuple[int, str | None]:
    """``(workers, note)``: with helpers, every process may hold one probe prefill at once (each group's float K/V,
    ``rows x context`` tokens); auto mode keeps to one process when ``workers`` times the largest would take more
    than half the available memory (a 7B model's 100-prompt passkey prefill at 512 tokens is ~6.7 GB), and says so
    in ``note``. An explicit ``cfg.workers`` is kept as asked."""
    if workers == 1 or cfg.workers is not None or long_ctx is None or not long_ctx.built():
        return workers, None
    try:
        from kvlab.plan.spec import spec_from_config

        spec = spec_from_config(model.config.to_dict())
        per_token = (
            spec.kv_elements_per_token_per_layer * spec.kv_layers * next(model.parameters()).element_size()
        )
    except ValueError:  # an architecture the planner cannot read: no estimate, no limit
        return workers, None
    largest = max(p.prompt_ids.numel() for p in long_ctx.built().values()) * per_token
    from kvlab.runtime.provenance import available_memory_bytes

    available = available_memory_bytes()
    if available is None or workers * largest <= available / 2:
        return workers, None
    return 1, (
        f"one process: {workers} probe prefills of up to {largest / 2**30:.2f} GiB at once would take more than half "
        f"the available memory ({available / 2**30:.2f} GiB)"
    )


class _Matrix:
    """Measures the cells of both matrices: :meth:`measure` the float baseline and every runnable candidate of a
    cell (outputs, bytes, quality), :meth:`probe_jobs` their long-context probes, :meth:`time` every cache of a
    cell timed interleaved; rows go to ``result``."""

    def __init__(self, cfg, model, tokenizer, result, progress, advance):
        self.cfg, self.model, self.tokenizer, self.result = cfg, model, tokenizer, result
        self.progress, self.advance = progress, advance
        self.device = next(model.parameters()).device
        self.cell = _Cell(cfg, model, _pad_id(tokenizer), result, progress)
        cands = [Candidate.parse(n) for n in cfg.candidates]
        self.runnable = [c for c in cands if c.family != "dynamic" and c.unavailable_reason() is None]
        self.long_ctx = _LongContext(cfg, model, tokenizer, result) if cfg.long_context else None
        self.base_cand = Candidate.parse("dynamic")

    # ── long-context probes ────────────────────────────────────────────────────────────────────────────────────
    def probe_jobs(self, cells, kept: frozenset = frozenset()) -> list[_ProbeJob]:
        """Every cache's probe jobs over ``cells`` (identical ones once), those sharing a prefill adjacent, the
        largest prefill first (a helper starts there; this process takes the last, cheapest ones). A probe too long
        for its context is recorded and its steps counted done. The cells in ``kept`` (``(matrix, context)``,
        finished in an earlier session of a resumed run) get no job, their steps counted done; their probes are
        still built, so that the provenance (prompts, ``not_measured``) is the same as an uninterrupted run's."""
        if self.long_ctx is None:
            return []
        self.progress("planning the long-context probes")
        jobs: dict[tuple, _ProbeJob] = {}
        for name, ctx, _, residuals, group in cells:
            caches = [(self.base_cand, 0)] + _cell_caches(self.runnable, residuals)
            for kind in self.long_ctx.kinds(name, ctx):
                measurable = self.long_ctx.probe(kind, ctx) is not None
                for cand, r in caches:
                    key = _probe_key(kind, ctx, cand, r, group, self.cfg)
                    if not measurable or (name, ctx) in kept:
                        self.advance()  # its step (count_steps) is done: nothing to run
                    elif key not in jobs:
                        jobs[key] = _ProbeJob(kind, ctx, cand, r, group, key)
                    else:
                        self.advance()  # the same job in the other matrix: one run serves both
        # groups by their prefill's prompt tokens, largest first: a helper starts there, and where the two ends meet
        # (the one group both sides may prefill) the prefill is the cheapest; within a group the float cache first
        size = {k: p.prompt_ids.numel() for k, p in self.long_ctx.built().items()}
        return sorted(jobs.values(), key=lambda j: (-size[(j.kind, j.ctx)], j.kind, j.ctx))

    def job(self, job: _ProbeJob) -> Callable[[], dict]:
        """The probe job as a zero-argument callable (it runs in this process or a forked helper)."""

        def run() -> dict:
            states, prefill_ms = self.long_ctx.states(job.kind, job.ctx)
            if job.cand.family == "dynamic":
                make = lambda: self.base_cand.make(self.model.config, 0, job.group)  # noqa: E731
            else:
                cfg = self.cfg
                make = lambda: job.cand.make(  # noqa: E731
                    self.model.config, job.residual, job.group, cfg.hqq_group_size, cfg.kivi_attention
                )
            probe = self.long_ctx.probe(job.kind, job.ctx)
            out = measure_long_context(self.model, make, {job.kind: probe}, {job.kind: states})[job.kind]
            return {"probe": out, "prefill_ms": prefill_ms}

        return run

    def probe_done(self, jobs: list[_ProbeJob]) -> Callable[[int, tuple], None]:
        """The progress step of each finished probe job (whichever process ran it)."""

        def done(i: int, outcome: tuple) -> None:
            j = jobs[i]
            where = f"{j.kind}, context {j.ctx}, {j.cand.name}" + (
                f", R={j.residual}" if j.cand.uses_residual else ""
            )
            if outcome[0] == "ok":
                if outcome[1]["prefill_ms"] is not None:
                    self.long_ctx.prefill_done(j.kind, j.ctx, outcome[1]["prefill_ms"])
                self.progress(f"long context: {where}")
            else:
                self.progress(
                    f"[red]long context failed: {where}: {outcome[1]['type']}: {outcome[1]['message']}"
                )
            self.advance()

        return done

    def attach_probes(self, measured: list, jobs: list[_ProbeJob], outcomes: list[tuple]) -> None:
        """Put each cache's probe results into its measurement; a failed float-cache probe drops the cell's
        probes (recorded once per cell), a failed candidate probe fails that candidate (recorded, not timed)."""
        if self.long_ctx is None:
            return
        by_key = {j.key: o for j, o in zip(jobs, outcomes)}
        for cell in measured:
            if cell is None:
                continue
            ctx, group = cell["ctx"], cell["group"]
            kinds = [
                k for k in self.long_ctx.kinds(cell["name"], ctx) if self.long_ctx.probe(k, ctx) is not None
            ]
            base_out = {k: by_key[_probe_key(k, ctx, self.base_cand, 0, group, self.cfg)] for k in kinds}
            bad = next((o[1] for o in base_out.values() if o[0] != "ok"), None)
            if bad is not None:
                self.long_ctx.failed(cell["name"], ctx, bad)
                continue
            if kinds:
                cell["base"]["long_context"] = {k: o[1]["probe"] for k, o in base_out.items()}
            kept = []
            for c, r, meas in cell["measured"]:
                outs = {k: by_key[_probe_key(k, ctx, c, r, group, self.cfg)] for k in kinds}
                bad = next((o[1] for o in outs.values() if o[0] != "ok"), None)
                if bad is not None:
                    self.result["failures"].append(
                        {
                            "matrix": cell["name"],
                            "candidate": c.name,
                            "context_length": ctx,
                            "residual_length": r,
                            "stage": "long_context",
                            **bad,
                        }
                    )
                    continue
                if kinds:
                    meas["long_context"] = {k: o[1]["probe"] for k, o in outs.items()}
                kept.append((c, r, meas))
            cell["measured"] = kept

    # ── one cell ───────────────────────────────────────────────────────────────────────────────────────────────
    def measure(
        self, name: str, ctx: int, new_tokens: int, residuals: list[int], group: int, poll
    ) -> dict | None:
        """The cell's untimed measurements: ``{"name", "ctx", "new_tokens", "group", "ids", "base", "measured"}``,
        or None when its baseline failed. ``poll`` delivers the helpers' finished probes between caches."""
        ids, prompt_info = build_prompts(self.cfg, self.tokenizer, ctx, self.device)
        self.result["provenance"]["prompts"].append(prompt_info)
        base = self.baseline(name, ids, ctx, new_tokens, residuals, group)
        poll()
        if base is None:
            return None
        continuation = base["generated"][:, : self.cfg.quality_tokens].to(self.device)
        measured = []
        for c, r in _cell_caches(self.runnable, residuals):
            self.progress(f"{name}: context {ctx}, {c.name}" + (f", R={r}" if c.uses_residual else ""))
            meas = self.cell.measure(
                c, ids, new_tokens, r, group, continuation, base, name == "capacity", matrix=name
            )
            if meas is not None:
                measured.append((c, r, meas))
            self.advance()
            poll()
        base["quality"].pop("prefill_states", None)  # the cell's caches are filled: free the float prefill
        base["quality"].pop("prefill_logits", None)
        return {
            "name": name,
            "ctx": ctx,
            "new_tokens": new_tokens,
            "group": group,
            "ids": ids,
            "base": base,
            "measured": measured,
        }

    def time(self, cell: dict) -> None:
        """Time the cell's caches interleaved, add its rows and mark the cell finished (:meth:`finished`)."""
        name, ctx, new_tokens, group = cell["name"], cell["ctx"], cell["new_tokens"], cell["group"]
        base, measured = cell["base"], cell["measured"]
        self.progress(
            f"{name}: context {ctx}, timing {1 + len(measured)} caches interleaved x {self.cfg.repeat}"
        )
        self.cell.time_paired(
            cell["ids"],
            new_tokens,
            [("dynamic", "dynamic", None, base)]
            + [(f"{c.name}|R={r}", c.name, r, meas) for c, r, meas in measured],
            matrix=name,
        )
        if not base.get("failed"):
            rows = self.result["rows"]
            rows.append(_row(name, self.base_cand, ctx, new_tokens, None, None, base, None, self.cfg))
            for c, r, meas in measured:
                if not meas.get("failed"):
                    rows.append(_row(name, c, ctx, new_tokens, r, group, meas, base, self.cfg))
        self.finished(name, ctx)
        self.advance()  # the timing is a step of its own (in the window matrix the longest); the CLI saves here

    def finished(self, name: str, ctx: int) -> None:
        """Record the ``name`` cell at ``ctx`` as finished in ``result["cells_done"]``: its rows and failures are
        all in ``result`` (a resumed run keeps them and measures the cell no more)."""
        self.result["cells_done"].append({"matrix": name, "context_length": ctx})

    def keep(self, name: str, ctx: int, new_tokens: int, residuals: list[int], group: int) -> None:
        """A cell finished in an earlier session of a resumed run: its prompt recorded again (cheap; the
        provenance lists every cell's), its measurement and timing steps counted done."""
        _, prompt_info = build_prompts(self.cfg, self.tokenizer, ctx, self.device)
        self.result["provenance"]["prompts"].append(prompt_info)
        for _ in range(2 + len(_cell_caches(self.runnable, residuals))):  # baseline, candidates, timing
            self.advance()

    def baseline(self, name, ids, ctx, new_tokens, residuals, group) -> dict | None:
        """The float cache's measurement with its quality; None (and a ``BaselineFailed`` failure per candidate
        and residual, their steps and the cell's timing step counted done) when it failed."""
        self.progress(f"{name}: context {ctx}, dynamic baseline")
        make = self.base_cand.make
        base = self.cell.measure(
            self.base_cand, ids, new_tokens, 0, group, None, None, name == "capacity", matrix=name
        )
        self.advance()
        if base is None:
            caches = _cell_caches(self.runnable, residuals)
            for c, r in caches:
                self.result["failures"].append(
                    {
                        "matrix": name,
                        "candidate": c.name,
                        "context_length": ctx,
                        "residual_length": r,
                        "stage": "baseline",
                        "type": "BaselineFailed",
                        "message": "the dynamic baseline failed for this prompt",
                    }
                )
            self.finished(name, ctx)  # nothing left to measure or time in it
            for _ in range(len(caches) + 1):  # each candidate's step and the cell's timing step, not run
                self.advance()
            return None
        continuation = base["generated"][:, : self.cfg.quality_tokens].to(self.device)
        base["quality"] = fixed_continuation(
            self.model, ids, continuation, make(self.model.config, 0, group), self.cfg.top_k
        )
        return base


def _probe_kinds(cfg: EvalConfig, matrix: str, ctx: int) -> list[str]:
    """The probes of one cell: recall always, passkey in the capacity matrix at the passkey contexts."""
    return ["recall"] + (["passkey"] if matrix == "capacity" and ctx in cfg.passkey_contexts() else [])


def _probe_key(kind: str, ctx: int, cand: Candidate, residual: int, group: int, cfg: EvalConfig) -> tuple:
    """What makes two probe jobs the same: the probe, the cache and the settings it quantizes with."""
    if cand.family == "dynamic":
        return (kind, ctx, "dynamic")
    return (
        kind,
        ctx,
        cand.name,
        residual if cand.uses_residual else None,
        _group_size(cand, residual, group, cfg),
    )


def _probe_job_count(cfg: EvalConfig) -> int:
    """Probe jobs of a run before deduplication (each a progress step; a duplicate's step is counted done when it
    is planned)."""
    if not cfg.long_context:
        return 0
    runnable = [Candidate.parse(n) for n in cfg.candidates if n != "dynamic"]
    runnable = [c for c in runnable if c.unavailable_reason() is None]
    n = 0
    for name, ctx, _, residuals, _ in _cells(cfg):
        n += len(_probe_kinds(cfg, name, ctx)) * (1 + len(_cell_caches(runnable, residuals)))
    return n


def count_steps(cfg: EvalConfig) -> int:
    """Progress steps of :func:`run_eval`: one per measured cache of a cell, one per cell for its timing, and one
    per cache and long-context probe of a cell."""
    runnable = [
        n for n in cfg.candidates if n != "dynamic" and Candidate.parse(n).unavailable_reason() is None
    ]
    steps = len(cfg.contexts) * (2 + len(runnable))
    if cfg.window_residuals:
        with_r = sum(1 for n in runnable if Candidate.parse(n).uses_residual)
        steps += 2 + len(runnable) + (len(cfg.window_residuals) - 1) * with_r
    return steps + _probe_job_count(cfg)


__all__ = [
    "SELECTED_KEYS",
    "apply_gates",
    "count_steps",
    "decide",
    "describe_model",
    "new_result",
    "plan_cells",
    "resolve_device",
    "run_eval",
    "summarize",
]
