"""Settings of the quantization chapter's paired float-vs-quantized cache experiment, validated on construction."""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, fields

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.settings import HQQ_GROUP_SIZE
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import check_device_name
from kvlab.runtime.dtype_names import MODEL_DTYPES, alias_hint

PROMPT_MODES = ("heldout", "repeat")
# how a CPU run's Linear layers multiply: "float32" GEMMs on the model dtype's values (kvlab.runtime.dtypes.
# float32_gemms), torch's "native" kernels for the dtype, or "auto": float32 where the dtype is emulated
CPU_MATMUL_MODES = ("auto", "native", "float32")
# the quantization chapter's prompt, which its repeated-prompt mode tiles to the target length
SEED_PROMPT = "Explain why KV Cache grows with context length."
# how kvlab eval selects among the capacity rows that pass every gate (kvlab.eval.decision.decide, docs/EVAL.md):
# "memory" the row saving the most cache bytes; "latency" the lowest latency ratio at the context "memory" selects
PREFERENCES = ("memory", "latency")
# settings added after result files were first written, with the value a file without them was decided under
# (EvalConfig.from_dict fills them in: an older file reads as it was run)
# allow_past_limit: a file written before the refusal ran past the model's positions with a warning only
LATER_SETTINGS = {"prefer": "memory", "allow_past_limit": True}
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _fractions(name: str, values: tuple[float, ...]) -> None:
    if not values:
        raise ValueError(f"`{name}` must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"`{name}` must hold fractions in [0, 1], got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"`{name}` must not repeat a value, got {list(values)}")


def _positive_ints(name: str, values: tuple[int, ...], allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise ValueError(f"`{name}` must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"`{name}` must hold positive integers, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"`{name}` must not repeat a value, got {list(values)}")


@dataclass(frozen=True)
class Gates:
    """Acceptance gates: the quantization chapter's mean NLL delta, mean top-k overlap and latency ratio, and the
    long-context gates (docs/EVAL.md, "Long-context gates" gives the reasons for the defaults).

    Attributes:
        max_nll_delta: mean NLL, candidate minus float cache (nats per token).
        min_topk_overlap: mean top-k overlap with the float cache (fraction).
        max_latency_ratio: median ``generate()`` time, candidate / float cache.
        max_recall_drop: copy accuracy of the float cache minus the candidate's, at the worst distance (fraction).
        max_passkey_drop: passkey accuracy (mean over depths) of the float cache minus the candidate's (fraction).
        max_kl_mean: mean KL(float cache || candidate) of the next-token distribution on the fixed continuation
            (nats per position).
    """

    max_nll_delta: float = 0.50
    min_topk_overlap: float = 0.60
    max_latency_ratio: float = 2.00
    max_recall_drop: float = 0.05
    max_passkey_drop: float = 0.05
    max_kl_mean: float = 0.10

    def __post_init__(self) -> None:
        for name in (
            "max_nll_delta",
            "min_topk_overlap",
            "max_latency_ratio",
            "max_recall_drop",
            "max_passkey_drop",
            "max_kl_mean",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"`{name}` must be a finite number, got {value!r}")
        if not self.max_nll_delta >= 0:
            raise ValueError(f"`max_nll_delta` must be >= 0, got {self.max_nll_delta!r}")
        if not 0 <= self.min_topk_overlap <= 1:
            raise ValueError(f"`min_topk_overlap` must be in [0, 1], got {self.min_topk_overlap!r}")
        if not self.max_latency_ratio > 0:
            raise ValueError(f"`max_latency_ratio` must be > 0, got {self.max_latency_ratio!r}")
        for name in ("max_recall_drop", "max_passkey_drop"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"`{name}` must be in [0, 1], got {getattr(self, name)!r}")
        if not self.max_kl_mean >= 0:
            raise ValueError(f"`max_kl_mean` must be >= 0, got {self.max_kl_mean!r}")


@dataclass(frozen=True)
class EvalConfig:
    """Every knob of ``kvlab eval``; defaults are the quantization chapter's matrices with kvlab's KIVI candidates.

    Attributes:
        model: HF hub id or local directory; ``None`` = the bundled reference model.
        dtype: model dtype, one of :data:`kvlab.runtime.dtype_names.MODEL_DTYPES` (the quantization chapter uses
            bfloat16).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
        candidates: cache candidates; ``"dynamic"`` is the baseline and is always run first.
        contexts: capacity-matrix prompt lengths in tokens.
        new_tokens: tokens generated per capacity-matrix run.
        residual_length / group_size: KIVI ``R`` and ``G`` of the capacity matrix.
        window_context / window_new_tokens / window_residuals / window_group_size: the residual-window matrix
            (``window_group_size`` must divide every residual; the quantization chapter's R=16 needs G <= 16).
        warmup / repeat: untimed ``generate()`` calls per cache before the timed rounds, counting the one that
            records its outputs, bytes and peak memory, which always runs (so 0 and 1 are the same: one call, the
            quantization chapter's WARMUP_STEPS), and timed rounds per cell (each round times every cache of the
            cell once, in an order rotated per round; ratios come from same-round pairs).
        quality_tokens / top_k: fixed-continuation length and the k of top-k overlap.
        prompt_mode: ``"heldout"`` (held-out text cut to exact lengths) or ``"repeat"`` (the quantization chapter tiles one prompt).
        batch: prompts per generate call (each row a different held-out slice).
        seed: torch seed and held-out offset seed.
        threads: torch threads for the run (``torch.set_num_threads``); ``None`` = :func:`kvlab.runtime.timing.
            default_threads` (``OMP_NUM_THREADS`` if set, else all usable CPUs but one: two threads on a shared
            2-core machine slow down 10-150x whenever another process runs); at most ``os.cpu_count()``.
        hqq_group_size: group size of the HQQ/quanto candidates (the quantization chapter uses 64).
        kivi_attention: ``"fused"`` (kvlab attention reads packed codes; no float copy of the history) or
            ``"dequantize"`` (the cache returns float K/V to the model's own attention), for every KIVI candidate
            that does not name its own (``kivi-4-fused``, ``kivi-4-dequant``); ``kivi-k8v4`` (own key and value
            bits) always runs the dequantize path (:func:`kvlab.eval.candidates.run_attention`).
        cpu_matmul: how a bf16/fp16 model's Linear layers and attention compute on a CPU: ``"float32"`` (float32
            GEMMs and SDPA on the dtype's values, outputs rounded back: :func:`kvlab.runtime.dtypes.float32_gemms`,
            :func:`kvlab.runtime.dtypes.float32_attention`), ``"native"``
            (torch's kernels for the dtype) or ``"auto"``: float32 when the run's first measurement finds the dtype
            emulated (:func:`kvlab.runtime.dtypes.matmul_time_ratio` above ``SLOW_DTYPE_RATIO``), else native.
            A GPU run always uses its native kernels (``"float32"`` there is an error).
        workers: processes for the untimed long-context probes (:class:`kvlab.runtime.workers.SplitJobs`): the
            run's own plus ``workers - 1`` forked helpers, each on a spare CPU, that run the probes while this
            process records its caches; every timed round runs after them, on a quiet machine. ``None`` (auto): 2
            on a Linux CPU run with a CPU spare beside ``threads``, else 1. Results do not depend on it.
        long_context: measure recall (every capacity and window cell) and passkey retrieval
            (``retrieval_contexts``); see :mod:`kvlab.eval.longctx`. The KL divergence is always measured.
        recall_span_tokens / recall_fractions / recall_rows: copy span length L, copy distances as fractions of
            the context (near, mid, far) and prompts per distance.
        passkey_trials / passkey_depths: trials per (depth, context) point and the needle depths (fractions).
        retrieval_contexts: capacity contexts that get the passkey grid; ``None`` = the smallest capacity
            context (the passkey prefill is ``len(passkey_depths) * passkey_trials`` prompts per context and
            every candidate quantizes all of them: the largest cost of the run), ``()`` = none.
        gates: the acceptance thresholds (:class:`Gates`).
        prefer: how the decision selects among the rows that pass every gate (:data:`PREFERENCES`): ``"memory"``
            the most cache bytes saved, ``"latency"`` the lowest latency ratio at the context ``"memory"`` selects
            (:func:`kvlab.eval.decision.decide`).
        allow_past_limit: run cells whose prompt + new tokens pass the model's ``max_position_embeddings`` (warned
            about, the decision carrying a caveat); False: ``kvlab eval`` refuses them
            (:func:`kvlab.eval.model_info.context_limit_problem`).
    """

    model: str | None = None
    dtype: str = "bfloat16"
    device: str = "auto"
    candidates: tuple[str, ...] = ("dynamic", "kivi-4", "kivi-2", "hqq-4")
    contexts: tuple[int, ...] = (512, 2048, 4096)
    new_tokens: int = 64
    residual_length: int = KIVI_DEFAULTS.residual_length
    group_size: int = KIVI_DEFAULTS.group_size
    window_context: int = 512
    window_new_tokens: int = 128
    window_residuals: tuple[int, ...] = (16, 32, 64)
    window_group_size: int = 16
    warmup: int = 1
    repeat: int = 3
    quality_tokens: int = 16
    top_k: int = 5
    prompt_mode: str = "heldout"
    prompt: str = SEED_PROMPT
    batch: int = 1
    seed: int = 42
    threads: int | None = None
    hqq_group_size: int = HQQ_GROUP_SIZE
    kivi_attention: str = "fused"
    cpu_matmul: str = "auto"
    workers: int | None = None
    long_context: bool = True
    recall_span_tokens: int = 32
    recall_fractions: tuple[float, ...] = (0.25, 0.5, 0.9)
    recall_rows: int = 2
    passkey_trials: int = 20
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    retrieval_contexts: tuple[int, ...] | None = None
    gates: Gates = field(default_factory=Gates)
    prefer: str = "memory"
    allow_past_limit: bool = False

    def _check_run_settings(self) -> None:
        """``seed`` (0 .. 2**64 - 1, as ``kvlab tasks --seed`` and paging's: torch.manual_seed's non-negative range)
        and ``threads`` (None, with a valid ``OMP_NUM_THREADS`` if set, or 1 .. ``os.cpu_count()``)."""
        check_int("seed", self.seed, 0)  # the rule and wording of TaskSuiteConfig's seed
        if self.seed >= 2**64:
            raise ValueError(f"`seed` must be an int < 2**64 (torch.manual_seed), got {self.seed!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"`threads` must be a positive integer, got {self.threads!r}")  # None: unset
        # without threads the run reads OMP_NUM_THREADS: a bad value is named now, not after the model loaded
        if self.threads is None:
            from kvlab.runtime.timing import default_threads

            default_threads()
        cpus = os.cpu_count() or 1
        # torch would start every thread asked for, spinning on `cpus` cores
        if self.threads is not None and self.threads > cpus:
            raise ValueError(f"`threads` must be at most the {cpus} CPUs of this machine, got {self.threads}")
        if self.workers is not None:
            from kvlab.runtime.timing import default_threads
            from kvlab.runtime.workers import resolve_workers

            device = (
                "cpu" if self.device == "auto" else self.device.split(":")[0]
            )  # cuda is refused at run start
            resolve_workers(self.workers, self.threads or default_threads(), device)

    def __post_init__(self) -> None:
        self._check_names()
        _positive_ints("contexts", self.contexts)
        _positive_ints("window_residuals", self.window_residuals, allow_empty=True)
        for name in (
            "new_tokens",
            "group_size",
            "window_context",
            "window_new_tokens",
            "window_group_size",
            "repeat",
            "quality_tokens",
            "top_k",
            "batch",
            "hqq_group_size",
            "recall_rows",
            "passkey_trials",
        ):
            value = getattr(self, name)  # one number: "must hold positive integers" read as a list's error
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
        for name in ("long_context", "allow_past_limit"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be a bool, got {getattr(self, name)!r}")
        if (
            isinstance(self.recall_span_tokens, bool)
            or not isinstance(self.recall_span_tokens, int)
            or self.recall_span_tokens < 2
        ):
            raise ValueError(f"`recall_span_tokens` must be an integer >= 2, got {self.recall_span_tokens!r}")
        _fractions("recall_fractions", self.recall_fractions)
        _fractions("passkey_depths", self.passkey_depths)
        if self.retrieval_contexts is not None:
            _positive_ints("retrieval_contexts", self.retrieval_contexts, allow_empty=True)
            bad = [c for c in self.retrieval_contexts if c not in self.contexts]
            if bad:
                raise ValueError(
                    f"`retrieval_contexts` must be capacity contexts {list(self.contexts)}, got {bad} that are not"
                )
        self._check_run_settings()
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"`warmup` must be a non-negative integer, got {self.warmup!r}")
        if self.residual_length < 0 or self.residual_length % self.group_size:
            raise ValueError(
                f"`residual_length` ({self.residual_length}) must be a non-negative multiple of "
                f"`group_size` ({self.group_size})"
            )
        bad = [r for r in self.window_residuals if r % self.window_group_size]
        if bad:
            raise ValueError(
                f"`window_group_size` ({self.window_group_size}) must divide every window residual, got {bad}"
            )
        if self.quality_tokens > self.new_tokens:
            raise ValueError(
                f"`quality_tokens` ({self.quality_tokens}) must not exceed `new_tokens` ({self.new_tokens}): the "
                f"continuation is the baseline's greedy output"
            )
        if self.prompt_mode == "repeat" and not self.prompt.strip():
            raise ValueError("`prompt` must not be empty in repeat mode")

    def _check_names(self) -> None:
        """The settings given by name: model, dtype, device, attention path, prompt mode and candidates.

        Raises:
            ValueError: an empty model, an unknown dtype/device/attention/prompt mode or a bad candidate name (each
                named).
        """
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(
                f"`model` must name a hub id or a folder (or be None: the bundled model), got {self.model!r}"
            )
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"`dtype` must be one of {list(MODEL_DTYPES)}, got {self.dtype!r}{alias_hint(self.dtype)}")
        check_device_name(self.device)  # the rule bench and tasks use: cpu, cuda, cuda:N or auto
        if self.kivi_attention not in ("fused", "dequantize"):
            raise ValueError(f"`kivi_attention` must be 'fused' or 'dequantize', got {self.kivi_attention!r}")
        if self.cpu_matmul not in CPU_MATMUL_MODES:
            raise ValueError(f"`cpu_matmul` must be one of {list(CPU_MATMUL_MODES)}, got {self.cpu_matmul!r}")
        if self.cpu_matmul == "float32" and str(self.device).startswith("cuda"):
            raise ValueError(
                f"`cpu_matmul` 'float32' applies to a CPU run, got device {self.device!r} (a GPU multiplies "
                f"bf16/fp16 natively): use 'auto' or 'native'"
            )
        if self.prefer not in PREFERENCES:
            raise ValueError(f"`prefer` must be one of {list(PREFERENCES)}, got {self.prefer!r}")
        if self.prompt_mode not in PROMPT_MODES:
            raise ValueError(f"`prompt_mode` must be one of {list(PROMPT_MODES)}, got {self.prompt_mode!r}")
        from kvlab.eval.candidates import check_candidate_names  # local: candidates imports torch

        # kivi-k8v4 runs dequantized whatever the run's path (the fused one reads K and V at one width):
        # kvlab.eval.candidates.run_attention; kivi-4 and kivi-4-fused are one cache in a fused run
        check_candidate_names(self.candidates, self.kivi_attention)

    def to_dict(self) -> dict:
        """JSON-ready settings."""
        return asdict(self)

    @classmethod
    def from_dict(cls, settings: object) -> EvalConfig:
        """The config whose :meth:`to_dict` is ``settings`` (a result's ``settings``, read back from JSON: lists
        become tuples again, ``gates`` a :class:`Gates`); every setting must be there, and no other key, except a
        setting of :data:`LATER_SETTINGS` (added since), which a file without it reads at the value it ran under.

        Raises:
            ValueError: ``settings`` is not an object, lacks a setting or holds a key that is none (a file of
                another kvlab version), or holds a value :class:`EvalConfig` or :class:`Gates` refuses.
        """
        if not isinstance(settings, dict) or not isinstance(settings.get("gates"), dict):
            raise ValueError("settings must be an object with a `gates` object")
        settings = {**LATER_SETTINGS, **settings}
        for kind, names, given in (
            ("settings", [f.name for f in fields(cls)], settings),
            ("gates", [f.name for f in fields(Gates)], settings["gates"]),
        ):
            missing = [n for n in names if n not in given]
            unknown = [k for k in given if k not in names]
            if missing or unknown:
                parts = [
                    f"{what} {names}"
                    for what, names in (("lacks", missing), ("has unknown", unknown))
                    if names
                ]
                raise ValueError(f"its {kind} {' and '.join(parts)}: written by another kvlab version")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k != "gates"}
        return cls(**values, gates=Gates(**settings["gates"]))

    def passkey_contexts(self) -> tuple[int, ...]:
        """The capacity contexts that get the passkey grid: ``retrieval_contexts``, or the smallest context when it
        is None; ``()`` when ``long_context`` is off."""
        if not self.long_context:
            return ()
        if self.retrieval_contexts is None:
            return (min(self.contexts),)
        return tuple(self.retrieval_contexts)


# the ``--quick`` matrix's settings over EvalConfig's defaults (read by quick_config and by the flag's help text)
QUICK_SETTINGS = dict(
    contexts=(256, 1024),
    new_tokens=16,
    window_context=256,
    window_new_tokens=48,
    window_residuals=(16, 32),
    repeat=1,
    quality_tokens=8,
    passkey_trials=8,
)


def quick_config(**overrides) -> EvalConfig:
    """The ``--quick`` matrix, a smoke test: short contexts, few tokens, one timed repeat, 8 passkey trials a depth
    (the passkey grid's 5 x 8 prompts instead of 5 x 20 are most of a real model's probe prefill). About half a
    minute on the bundled model and about 3.5 on SmolLM2-135M on a busy 2-core CPU (docs/EVAL.md)."""
    base = dict(QUICK_SETTINGS)
    base.update(overrides)
    return EvalConfig(**base)


def check_label(label: str) -> str:
    """Return ``label`` if it is a safe file stem (letters, digits, '.', '_', '-'); raise ``ValueError`` otherwise."""
    if not isinstance(label, str) or not _LABEL.match(label) or label in (".", ".."):
        raise ValueError(f"`label` must be 1-100 characters of letters, digits, '.', '_' or '-', got {label!r}")
    return label
