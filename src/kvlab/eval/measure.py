"""One cell's measurement: its prompt, the untimed measurement of each cache (outputs, bytes, peak memory,
quality against the float baseline), then every cache of the cell timed together, interleaved.

A cache that fails is recorded (:class:`kvlab.eval.records.Failure`) and the cell goes on without it. The numbers a
row compares with the baseline (NLL delta, top-k overlap, KL divergence, greedy agreement) are computed as soon as
the cache is measured, so a measurement keeps no tensor but its outputs until it is timed.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvlab.caches import cache_nbytes
from kvlab.eval.candidates import Candidate
from kvlab.eval.cells import Cell
from kvlab.eval.config import EvalConfig
from kvlab.eval.divergence import kl_divergence, kl_summary
from kvlab.eval.longctx import fill_cache
from kvlab.eval.metrics import compare_outputs, fixed_continuation, generate_once, run_generate, topk_overlap
from kvlab.eval.records import Failure, record_failure
from kvlab.eval.twins import pair_twins, twin_keys
from kvlab.runtime.device import synchronize
from kvlab.runtime.timing import interleaved, paired_ratio

Progress = Callable[[str], None]


@dataclass
class Measurement:
    """One cache's measurement in one cell. Untimed first (:meth:`CellMeasurer.measure`), then its ``perf`` gets
    the timed rounds and ``paired`` / ``contention`` (:meth:`CellMeasurer.time_cell`)."""

    candidate: Candidate
    residual: int | None  # the R it ran at (None: the baseline)
    make: Callable[[], Any]  # a fresh cache of this candidate, with the cell's settings
    perf: dict  # run_generate's: generated_tokens, incremental_peak_bytes, peak_memory_method; timings later
    cache_bytes: int  # exact bytes of the cache after one generate()
    cache_tokens: int  # tokens that cache holds: prompt + new tokens - 1
    generated: torch.Tensor | None  # [batch, new_tokens] greedy ids (None once read back: compared already)
    cache_bytes_breakdown: dict | None = None
    cache_counts: dict | None = None  # FP8: elements saturated / flushed to zero when stored
    # what the cache's kvlab attention ran (its attention_paths(): KIVI's key-score path, the float C kernel)
    attention_paths: list | None = None
    quality: dict | None = (
        None  # fixed_continuation's (the baseline keeps its tensors until its cell is measured)
    )
    compared: dict | None = None  # the quality and output comparison with the baseline (candidates)
    long_context: dict | None = None  # {probe kind: measure_long_context output}
    paired: dict | None = None  # same-round latency ratio to the baseline (paired_ratio)
    contention: dict | None = None  # how busy the machine was while the cell was timed
    failed: bool = False  # failed while timed: no row

    @property
    def key(self) -> str:
        """The cache's name in the cell's interleaved timing."""
        return "dynamic" if self.residual is None else f"{self.candidate.name}|R={self.residual}"

    # what of an untimed measurement its row needs later: kept in the result file until the cell is timed
    _KEPT = (
        "perf",
        "cache_bytes",
        "cache_tokens",
        "cache_bytes_breakdown",
        "cache_counts",
        "attention_paths",
        "quality",
        "compared",
    )

    def to_json(self) -> dict:
        """The untimed measurement as JSON, once its cell is measured (the tensors compared and dropped): the
        candidate, its R, and every field its row reads; :meth:`from_json` reads it back."""
        assert self.long_context is None and self.paired is None, (
            "saved between the cell's measurement and probes"
        )
        return {
            "candidate": self.candidate.name,
            "residual": self.residual,
            **{k: getattr(self, k) for k in self._KEPT},
        }

    @classmethod
    def from_json(cls, data: dict, make: Callable[[], Any]) -> Measurement:
        """A measurement read back from :meth:`to_json` (``make``: the fresh caches it is timed with)."""
        fields = {k: data[k] for k in cls._KEPT if k in data}  # attention_paths: absent in older files
        return cls(Candidate.parse(data["candidate"]), data["residual"], make, generated=None, **fields)


@dataclass
class CellMeasurement:
    """A cell's untimed measurements: its prompt, the baseline's and each candidate's."""

    cell: Cell
    ids: torch.Tensor  # [batch, context] prompt ids
    base: Measurement
    measured: list[Measurement]

    def to_json(self) -> dict:
        """``{matrix, context_length, base, measured}``: the cell's measurements as the result keeps them until the
        cell is timed (``result["cells_measured"]``), so that an interrupted run keeps what it measured."""
        return {
            "matrix": self.cell.matrix,
            "context_length": self.cell.context,
            "base": self.base.to_json(),
            "measured": [m.to_json() for m in self.measured],
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
                f"the held-out text has {total:,} tokens under this tokenizer, fewer than context {context}"
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


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its EOS id, else 0."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


def compare(base: Measurement, meas: Measurement, top_k: int) -> dict:
    """The row fields that compare a candidate's measurement with the baseline's of the same cell: ``nll_delta``,
    ``nll_ratio``, ``topk_overlap``, ``decode_latency_ratio`` (where both decode times are non-zero), the KL summary
    (:func:`kvlab.eval.divergence.kl_summary`, where both kept logits) when both were scored, and the greedy
    comparison (:func:`kvlab.eval.metrics.compare_outputs`)."""
    q, bq = meas.quality, base.quality
    out: dict = {}
    if q is not None and bq is not None:
        out["nll_delta"] = q["mean_nll"] - bq["mean_nll"]
        out["nll_ratio"] = q["mean_nll"] / max(1e-9, bq["mean_nll"])
        out["topk_overlap"] = topk_overlap(bq["topk_ids"], q["topk_ids"], top_k)
        if q["decode_ms"] and bq["decode_ms"]:
            out["decode_latency_ratio"] = q["decode_ms"] / bq["decode_ms"]
        if q.get("logits") is not None and bq.get("logits") is not None:  # llama.cpp's --kl-divergence
            out["kl"] = kl_summary(kl_divergence(bq["logits"], q["logits"]))
    out["outputs"] = compare_outputs(base.generated, meas.generated)
    return out


class CellMeasurer:
    """Measures the caches of one cell after another (:meth:`measure_cell`) and times them (:meth:`time_cell`);
    failures go to ``result["failures"]``, not raised."""

    def __init__(self, cfg: EvalConfig, model: Any, pad_token_id: int, result: dict, progress: Progress):
        self.cfg, self.model, self.result, self.progress = cfg, model, result, progress
        self.pad_id = pad_token_id

    def maker(self, cand: Candidate, residual: int, group: int) -> Callable[[], Any]:
        """A zero-argument factory of fresh caches of ``cand`` at ``residual`` / ``group``."""
        cfg, config = self.cfg, self.model.config
        return lambda: cand.make(config, residual, group, cfg.hqq_group_size, cfg.kivi_attention)

    def measure(
        self,
        cand: Candidate,
        ids,
        cell: Cell,
        residual: int | None,
        base: Measurement | None,
        keep_logits: bool = False,
    ) -> Measurement | None:
        """The untimed measurement of one cache (outputs, bytes, peak memory and, against ``base``, quality), or
        None when it failed (recorded with the cell's matrix). ``keep_logits``: its continuation's logits stay in
        ``quality`` after the comparison (an int8 twin's pair, :func:`kvlab.eval.twins.pair_twins`, drops them)."""
        stage = "construct"
        try:
            make = self.maker(cand, residual or 0, cell.group)
            make()
            stage = "generate"
            # one call for the outputs, bytes and peak memory (it also warms this cache up for the timed rounds);
            # the timed calls come later, interleaved with the other caches of the cell (time_cell)
            perf, cache, generated = run_generate(
                self.model,
                ids,
                make,
                cell.new_tokens,
                max(0, self.cfg.warmup - 1),
                0,
                self.pad_id,
                cell.matrix == "capacity",
            )
            stage = "cache_bytes"
            meas = Measurement(
                cand,
                residual,
                make,
                perf,
                cache_nbytes(cache),
                int(ids.shape[1] + cell.new_tokens - 1),
                generated,
            )
            if hasattr(cache, "nbytes_breakdown"):
                meas.cache_bytes_breakdown = cache.nbytes_breakdown()
            if callable(getattr(cache, "counts", None)):
                meas.cache_counts = cache.counts()
            if callable(getattr(cache, "attention_paths", None)):
                meas.attention_paths = cache.attention_paths()
            del cache
            if base is not None:
                stage = "quality"
                continuation = base.generated[:, : self.cfg.quality_tokens].to(ids.device)
                meas.quality = self.quality(make, ids, continuation, base.quality)
        except Exception as exc:  # a failed candidate is recorded and the run goes on
            # the baseline's cache is made with R = 0, and its failure says so
            where = (cand.name, cell.matrix, int(ids.shape[1]), 0 if residual is None else residual)
            record_failure(self.result, Failure.of_cell(stage, exc, *where))
            self.progress(f"[red]{cand.name} failed at {stage}: {type(exc).__name__}: {exc}")
            return None
        if base is not None:
            meas.compared = compare(base, meas, self.cfg.top_k)
            # compared: the tensors are not needed any more (an int8 twin's pair keeps its logits a while)
            for key in ("topk_ids",) if keep_logits else ("logits", "topk_ids"):
                (meas.quality or {}).pop(key, None)
        return meas

    def quality(self, make, ids, continuation, shared: dict | None) -> dict:
        """:func:`fixed_continuation` of a fresh cache from ``make``, filled from the baseline's float prefill of
        the same prompt when the cache takes it (:func:`fill_cache`: its prefill attends with float K/V, so it
        would compute the same one); a cache that scores its prompt itself (SnapKV) or refuses the fill runs its
        own prefill. ``shared``: the baseline's :func:`fixed_continuation` of the same prompt."""
        cache = make()
        shared = shared or {}
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

    def baseline(self, ids, cell: Cell) -> Measurement | None:
        """The float cache's measurement with its quality (the continuation is its own greedy output), or None
        when it failed (recorded)."""
        self.progress(f"{cell.matrix}: context {cell.context}, dynamic baseline")
        base = self.measure(Candidate.parse("dynamic"), ids, cell, None, None)
        if base is not None:
            continuation = base.generated[:, : self.cfg.quality_tokens].to(ids.device)
            base.quality = fixed_continuation(self.model, ids, continuation, base.make(), self.cfg.top_k)
        return base

    def measure_cell(
        self, cell: Cell, ids, caches: list[tuple[Candidate, int]], advance: Callable[[], None], poll
    ) -> CellMeasurement | None:
        """The cell's untimed measurements: the baseline, then each of ``caches`` (``(candidate, residual)``,
        :func:`kvlab.eval.cells.cell_caches`), one progress step each, ``poll`` (the probe helpers' results) between
        them; None when the baseline failed (then every candidate gets a ``BaselineFailed`` failure)."""
        base = self.baseline(ids, cell)
        advance()
        poll()
        if base is None:
            for c, r in caches:
                failure = Failure("baseline", "BaselineFailed", "the dynamic baseline failed for this prompt")
                record_failure(
                    self.result,
                    replace(
                        failure,
                        candidate=c.name,
                        matrix=cell.matrix,
                        context_length=cell.context,
                        residual_length=r,
                    ),
                )
            return None
        measured = []
        twins = twin_keys(caches)  # an int8 twin is compared with its exact twin too: both keep their logits
        paired = set(twins) | set(twins.values())
        for c, r in caches:
            self.progress(
                f"{cell.matrix}: context {cell.context}, {c.name}" + (f", R={r}" if c.uses_residual else "")
            )
            meas = self.measure(c, ids, cell, r, base, keep_logits=(c.name, r) in paired)
            if meas is not None:
                measured.append(meas)
            advance()
            poll()
        pair_twins(
            {(m.candidate.name, m.residual): m for m in measured if (m.candidate.name, m.residual) in paired},
            twins,
        )
        for key in ("prefill_states", "prefill_logits", "logits", "topk_ids"):  # compared: free the tensors
            base.quality.pop(key, None)
        return CellMeasurement(cell, ids, base, measured)

    def restore(self, cell: Cell, ids, data: dict) -> CellMeasurement:
        """The cell an earlier session of a resumed run measured (:meth:`CellMeasurement.to_json`), its caches made
        afresh for the timing."""

        def read(d: dict) -> Measurement:
            make = self.maker(Candidate.parse(d["candidate"]), d["residual"] or 0, cell.group)
            return Measurement.from_json(d, make)

        return CellMeasurement(cell, ids, read(data["base"]), [read(d) for d in data["measured"]])

    def time_cell(self, ids, new_tokens: int, matrix: str, entries: list[Measurement]) -> None:
        """Time every measured cache of one cell interleaved (:func:`kvlab.runtime.timing.interleaved`,
        ``cfg.repeat`` rounds, order rotated per round) and write the timings into each ``perf``; each candidate also
        gets ``paired`` (its ratio to the baseline from same-round pairs) and every entry ``contention``.
        ``entries``: the baseline first. A cache that fails here is recorded and dropped from the cell (``failed``);
        when the baseline fails, every entry is."""
        live, failed = list(entries), []  # failed: keys whose call raised, latest last

        def call(meas: Measurement):
            def run():
                try:
                    generate_once(self.model, ids, meas.make, new_tokens, self.pad_id)
                    synchronize(ids.device)
                except Exception:
                    failed.append(meas.key)
                    raise

            return run

        while live:
            calls = {m.key: call(m) for m in live}
            try:
                with torch.inference_mode():
                    timings, cont = interleaved(calls, self.cfg.repeat, threads=torch.get_num_threads())
            except Exception as exc:  # recorded; the other caches of the cell are timed again without it
                bad = next(m for m in live if m.key == failed[-1]) if failed else live[0]
                failure = Failure("timing", type(exc).__name__, str(exc), bad.candidate.name, matrix)
                record_failure(
                    self.result,
                    replace(failure, context_length=int(ids.shape[1]), residual_length=bad.residual),
                )
                bad.failed = True
                if bad is live[0]:  # the baseline: nothing left to pair with
                    for m in live:
                        m.failed = True
                    return
                live.remove(bad)
                continue
            base_ms = timings[live[0].key]
            for m in live:
                t = timings[m.key]
                median = statistics.median(t)
                m.perf.update(
                    {
                        "median_ms": median,
                        "min_ms": min(t),
                        "timings_ms": t,
                        "ms_per_token": median / max(1, m.perf["generated_tokens"]),
                    }
                )
                m.contention = cont
                if m is not live[0]:
                    m.paired = paired_ratio(t, base_ms)
            return


__all__ = ["CellMeasurement", "CellMeasurer", "Measurement", "build_prompts", "compare", "pad_id"]
