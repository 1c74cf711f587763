"""A pasted vLLM startup log, read line by line and explained with kvlab's model of each figure.

:func:`read_vllm_log` picks out the lines that size the KV cache (V1 and V0 wordings); :func:`explain_vllm_log`
sets kvlab's prediction beside each: the tokens and concurrency from the log's own KV memory
(:mod:`kvlab.plan.vllm_kv`) and the KV memory from the device, utilization and weights
(:mod:`kvlab.plan.vllm_memory`). docs/plan.md ("vLLM's startup log") lists the lines and what kvlab assumes
where a log is silent. A value kvlab cannot read on a line it reads (``Available KV cache memory: nan GiB``, a
utilization of ``.``, a token count of ``451.744``, an unknown ``kv_cache_dtype``) is refused naming the line and
the value, not skipped as if the line were absent. Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from kvlab.plan.config_fields import check_int_at_least
from kvlab.plan.fit import check_memory_gib
from kvlab.plan.ledger import kv_heads_per_rank
from kvlab.plan.spec import ModelSpec
from kvlab.plan.vllm import check_block_size
from kvlab.plan.vllm_kv import vllm_kv_cache
from kvlab.plan.vllm_log_values import (
    COUNT,
    DTYPE,
    FRACTION,
    IN_GIB,
    KEY,
    KV_DTYPE,
    LENGTH,
    NAME,
    SERVE_OPTIONS,
    SETTING,
    SETTING_VALUE,
    SIGNED_GIB,
    TIMES,
    UNIT,
    UNTIL_NEXT,
    VALUE,
    WORD,
    lines_holding,
    mask_speculative,
    read_value,
)
from kvlab.plan.vllm_memory import GIB, available_kv_memory, scheduler_defaults

# figure -> (pattern, what the line is, kind of value); the first match in the log wins, but for PER_WORKER's and
# a setting stated with two values (read_vllm_log); a setting's name is not matched inside another's
# (draft_tensor_parallel_size, a speculative config's)
LOG_LINES: dict[str, tuple[str, str, str]] = {
    "available_kv_cache_gib": ("Available KV cache memory: " + VALUE + UNIT, "KV memory per GPU (V1)", IN_GIB),
    "v0_kv_cache_gib": ("kv_cache_size=" + VALUE + UNIT, "KV memory per GPU (V0 memory profile)", IN_GIB),
    "gpu_kv_cache_tokens": (r"GPU KV cache size: (\S+) tokens", "tokens of KV per GPU group", COUNT),
    # "# GPU blocks: N" as V0 logs it, or quoted without the "#" (the quote of case vllm-i10517-a in cases.jsonl)
    "num_gpu_blocks": (r"(?:# )?GPU blocks: ([^\s,]+)", "V0 blocks (x block size = tokens)", COUNT),
    "max_concurrency_tokens": (r"Maximum concurrency for (\S+) tokens per request", "max_model_len", COUNT),
    "max_concurrency": (r"tokens per request: (\S+?)x", "requests of max_model_len that fit", TIMES),
    "weights_gib": (
        r"(?:(?:Model loading took|Loading model weights took) " + VALUE + UNIT + r"|" + WORD + r" GiB for weight\b)",
        "weights per GPU",
        IN_GIB,
    ),
    "total_gib": (
        r"(?:total_gpu_memory=|Free memory on device \([0-9.]+/)" + VALUE + UNIT + r"\)?",
        "device memory (torch)",
        IN_GIB,
    ),
    "gpu_memory_utilization": (
        r"(?:gpu_memory_utilization" + KEY + r"|--gpu-memory-utilization[ =]|Desired GPU memory utilization is \()"
        + SETTING_VALUE,
        "utilization",
        FRACTION,
    ),
    "activation_gib": (WORD + r" GiB for peak activation", "profiled activation peak", IN_GIB),
    "non_torch_gib": (
        r"(?:" + WORD + r" GiB for non-torch memory|non_torch_memory=" + VALUE + UNIT + ")",
        "non-torch memory",
        SIGNED_GIB,
    ),
    "cuda_graph_gib": (
        r"(?:" + WORD + r" GiB for CUDAGraph memory|Graph capturing finished" + UNTIL_NEXT + "took " + VALUE + UNIT + ")",
        "CUDA graphs (printed, not subtracted)",
        SIGNED_GIB,
    ),
    "tensor_parallel_size": (r"(?:(?<![\w-])tensor_parallel_size" + KEY + "|--tensor-parallel-size[ =])" + SETTING_VALUE, "TP", SETTING),
    "decode_context_parallel_size": (
        r"(?:(?<![\w-])decode_context_parallel_size" + KEY + "|--decode-context-parallel-size[ =])" + SETTING_VALUE,
        "DCP",
        SETTING,
    ),
    "block_size": (r"(?:--block-size[ =]|(?<![\w-])block_size" + KEY + ")" + SETTING_VALUE, "tokens per block", SETTING),
    "max_model_len": (r"(?:--max-model-len[ =]|(?<![\w-])max_model_len" + KEY + ")" + SETTING_VALUE, "tokens per request", LENGTH),
    # the engine config line's "dtype=torch.float32", a CLI's --dtype, an args dump's dtype='half'
    "model_dtype": (
        r"(?:(?<![\w-])dtype" + KEY + r"|--dtype[ =])(?:torch\.)?" + SETTING_VALUE,
        "model dtype (KV auto)",
        DTYPE,
    ),
    "kv_cache_dtype": (r"(?:(?<![\w-])kv_cache_dtype" + KEY + "|--kv-cache-dtype[ =])" + SETTING_VALUE, "KV dtype", KV_DTYPE),
    "max_num_batched_tokens": (r"(?<![\w-])max_num_batched_tokens" + KEY + SETTING_VALUE, "scheduler token budget", SETTING),
    # the engine config line's model='...', an args dict's 'model': '...', a command line's --model / vllm serve X
    # (X: the first argument after `serve` that is not an option nor an option's value, as vLLM's argparse reads it)
    "model": (
        r"(?:(?<![\w-])model" + KEY + r"|--model[ =]|vllm serve" + SERVE_OPTIONS + r" +(?!-))" + SETTING_VALUE,
        "the model vLLM served",
        NAME,
    ),
    "vllm_version": (r"(?:vLLM[: |]+v?|engine \(v)([0-9]+\.[0-9]+\.[0-9]+)", "vLLM version", NAME),
    "engine_v0": (r"(Memory profiling results: total_gpu_memory)", "V0 engine", NAME),
}


# figure -> words one of which every match of its LOG_LINES pattern holds: a line holding none is not searched (the
# 22 patterns, each over the whole of an 18 MB log, took 8 s; no pattern matches across a line's end)
LINE_WORDS: dict[str, tuple[str, ...]] = {
    "available_kv_cache_gib": ("Available KV cache memory: ",),
    "v0_kv_cache_gib": ("kv_cache_size=",),
    "gpu_kv_cache_tokens": ("GPU KV cache size: ",),
    "num_gpu_blocks": ("GPU blocks: ",),
    "max_concurrency_tokens": ("Maximum concurrency for ",),
    "max_concurrency": ("tokens per request: ",),
    "weights_gib": ("Model loading took", "Loading model weights took", " GiB for weight"),
    "total_gib": ("total_gpu_memory=", "Free memory on device ("),
    "gpu_memory_utilization": (
        "gpu_memory_utilization", "--gpu-memory-utilization", "Desired GPU memory utilization is (",
    ),
    "activation_gib": (" GiB for peak activation",),
    "non_torch_gib": (" GiB for non-torch memory", "non_torch_memory="),
    "cuda_graph_gib": (" GiB for CUDAGraph memory", "Graph capturing finished"),
    "tensor_parallel_size": ("tensor_parallel_size", "--tensor-parallel-size"),
    "decode_context_parallel_size": ("decode_context_parallel_size", "--decode-context-parallel-size"),
    "block_size": ("block_size", "--block-size"),
    "max_model_len": ("max_model_len", "--max-model-len"),
    "model_dtype": ("dtype",),  # and --dtype
    "kv_cache_dtype": ("kv_cache_dtype", "--kv-cache-dtype"),
    "max_num_batched_tokens": ("max_num_batched_tokens",),
    "model": ("model", "vllm serve"),  # and --model
    "vllm_version": ("vLLM", "engine (v"),
    "engine_v0": ("Memory profiling results: total_gpu_memory",),
}  # fmt: skip
_COMPILED = {key: re.compile(pattern) for key, (pattern, _, _) in LOG_LINES.items()}


def log_matches(text: str, key: str) -> list[re.Match]:
    """Every match of ``key``'s :data:`LOG_LINES` pattern in ``text``, in order, as ``re.finditer`` over the whole
    text finds them, but searched only in the lines holding one of its :data:`LINE_WORDS` (a long log is mostly
    other lines: request logs, throughput metrics). Positions are the text's, so a match's line number and its quoted statement are the text's.

    Raises:
        KeyError: ``key`` is not a figure of :data:`LOG_LINES`.
    """
    rx = _COMPILED[key]
    return [m for start, end in lines_holding(text, LINE_WORDS[key]) for m in rx.finditer(text, start, end)]


# figure -> (its line's words, unit): each worker (TP/PP rank) logs its own KV memory, and vLLM sizes every
# rank's cache by the smallest (vllm/v1/core/kv_cache_utils.py, get_kv_cache_configs: "Change the num_blocks of
# each rank to the smallest among all ranks"; V0's executor takes its workers' minimum; vLLM 0.8-0.9 logged each
# worker's tokens and concurrency before that minimum)
PER_WORKER = {
    "available_kv_cache_gib": ("Available KV cache memory", " GiB"),
    "v0_kv_cache_gib": ("kv_cache_size", " GiB"),
    "gpu_kv_cache_tokens": ("GPU KV cache size", " tokens"),
    "num_gpu_blocks": ("GPU blocks", " blocks"),
    "max_concurrency": ("Maximum concurrency", "x"),
}
# the L of "Maximum concurrency for L tokens per request" is max_model_len, one setting of a start: two values are
# two starts of vLLM in one file, whose figures must not be mixed
PER_START = "max_concurrency_tokens"
_NEEDED = "'Available KV cache memory: N GiB' line (V0: 'kv_cache_size=N GiB')"



def _figure(key: str, m: re.Match, text: str) -> Any:
    """The figure one match of ``key``'s pattern holds (:func:`read_value`), or None for an unset setting.

    Raises:
        ValueError: an unreadable value, or a block size vLLM lacks (:func:`kvlab.plan.vllm.check_block_size`,
            ``vllm.config.cache.BlockSize``), naming the log's line number, the line's words and the value.
    """
    raw, *unit = (g for g in m.groups() if g is not None)
    try:
        value = read_value(LOG_LINES[key][2], raw, unit[0] if unit else None)
        if key == "block_size" and value is not None:  # one vLLM takes, as --block-size is checked
            check_block_size(value, what="block_size")
        if key == "total_gib" and value <= 0:  # a device without memory: nothing to size (--gpu-mem-gib > 0 too)
            raise ValueError(f"not a number of GiB > 0: {raw!r}")
        return value
    except ValueError as e:
        line = text.count("\n", 0, m.start()) + 1
        raise ValueError(f"line {line}, {quoted_statement(m, text)} ({LOG_LINES[key][1]}): {e}") from None


def _stated(key: str, matches: list[re.Match], text: str) -> list[tuple[Any, re.Match]]:
    """``(figure, match)`` of each of ``matches`` (of ``key``'s pattern in ``text``) that states a value
    (:func:`_figure`; an unset ``None`` states none), in order; a value written alike on many lines (a log of many
    starts, a paste repeated) is read once.

    Raises:
        ValueError: the first match whose value cannot be read (:func:`_figure`).
    """
    read: dict[tuple, Any] = {}
    stated = []
    for m in matches:
        groups = m.groups()
        if groups not in read:
            read[groups] = _figure(key, m, text)
        if read[groups] is not None:
            stated.append((read[groups], m))
    return stated

# the kinds of a setting of one start of vLLM: two values of one are refused (read_vllm_log), not the first taken
_ONE_VALUE = (SETTING, LENGTH, KV_DTYPE, DTYPE, FRACTION)


def _check_one_value(key: str, stated: list[tuple[Any, re.Match]], text: str) -> None:
    """Raise naming a setting ``stated`` (value, match) with two values, each with its line and words.

    vLLM runs with one value of each setting; which of two lines was its start kvlab cannot tell (a command line
    given a flag twice keeps the last, as argparse does, but a log's args line is vLLM's own dict or a paste), so
    neither is taken. Identical values (a log pasted twice, ``4K`` and ``4096``) are one.
    """
    (first, m1), other = stated[0], next((s for s in stated if s[0] != stated[0][0]), None)
    if other is None:
        return

    def where(value: Any, m: re.Match) -> str:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}" if isinstance(value, float) else value
        return f"{shown} (line {text.count(chr(10), 0, m.start()) + 1}, {quoted_statement(m, text)})"

    raise ValueError(
        f"the log states {'dtype' if key == 'model_dtype' else key} {where(first, m1)} and {where(*other)}: one "
        "start of vLLM runs with one; keep one start's lines, with one value of each setting"
    )



def read_vllm_log(text: str) -> dict[str, Any]:
    """The figures of :data:`LOG_LINES` found in ``text`` (numbers as float/int, names as str); absent ones left
    out.

    A line logged more than once (a TP/PP group's workers each log theirs; a file may hold more than one start):

    * a KV figure of :data:`PER_WORKER` (``Available KV cache memory``, V0's ``kv_cache_size``, the tokens, blocks
      and concurrency) is the smallest, not the first or the last: vLLM sizes every worker's cache by the
      smallest worker's; every value is kept under ``per_worker`` (figure -> values, in the log's order) when they
      differ, and :func:`explain_vllm_log` notes it;
    * the concurrency line's ``L`` (max_model_len) with two values is two starts of vLLM: refused, not mixed; so is
      an ``L`` other than the max_model_len the log states (vLLM prints ``model_config.max_model_len`` there:
      ``vllm/v1/core/kv_cache_utils.py``);
    * a setting (:data:`_ONE_VALUE`: max_model_len, block size, dtypes, TP, ...) or the model stated with two
      values (``--max-model-len 4096 --max-model-len 8192``, ``dtype=torch.float32`` beside ``--dtype float16``,
      ``model='llava-hf/...'`` beside ``model='google/gemma-3-1b-it'``, whose second was ignored) is refused naming
      both (:func:`_check_one_value`); stated twice alike, it is read once; ``model=None`` states none;
    * any other figure (the weights, the device memory) is the first.

    Raises:
        ValueError: the text holds none of the lines (not a vLLM startup log); it holds some but no KV memory line
            (a truncated log: the tokens and concurrency are sized from that memory), naming the figures it has;
            or two starts of vLLM (two concurrency lengths, one that is not the stated max_model_len, or two values
            of one setting).
    """
    found: dict[str, Any] = {}
    repeated: dict[str, list] = {}
    for key, (_, _, kind) in LOG_LINES.items():
        where = mask_speculative(text) if key == "model" else text  # a draft model is not the served one
        stated = _stated(key, log_matches(where, key), text)
        if not stated:
            continue
        if kind in _ONE_VALUE or key == "model":  # two models: two starts of vLLM, as two values of a setting
            _check_one_value(key, stated, text)
        values = [v for v, _ in stated]
        if key == PER_START and len(set(values)) > 1:
            raise ValueError(
                f"'Maximum concurrency for L tokens per request' gives {len(set(values))} max_model_len "
                f"({', '.join(f'{v:,}' for v in dict.fromkeys(values))}): more than one start of vLLM; keep one "
                "start's lines"
            )
        found[key] = min(values) if key in PER_WORKER else values[0]
        if key in PER_WORKER and len(set(values)) > 1:
            repeated[key] = values
    if repeated:
        found["per_worker"] = repeated
    if found.get("max_model_len", found.get(PER_START)) != found.get(PER_START, found.get("max_model_len")):
        raise ValueError(
            f"max_model_len {found['max_model_len']:,} contradicts 'Maximum concurrency for "
            f"{found[PER_START]:,} tokens per request' (vLLM prints its max_model_len there): the lines are of "
            "different starts of vLLM; keep one start's lines"
        )
    if "v0_kv_cache_gib" in found:
        found.setdefault("available_kv_cache_gib", found.pop("v0_kv_cache_gib"))
    if "available_kv_cache_gib" not in found:
        if not found:
            raise ValueError(f"no {_NEEDED} and no other line kvlab reads: not a vLLM startup log")
        raise ValueError(
            f"no {_NEEDED}, which kvlab sizes the tokens and concurrency from: the log stops before vLLM sized "
            f"its KV cache, or that line was left out (the figures it has: {', '.join(found)})"
        )
    return found


def quoted_statement(m: re.Match, text: str) -> str:
    """The statement ``m`` (a match of a :data:`LOG_LINES` pattern in ``text``) as a message quotes it, with the
    quotes around its key and value that the pattern leaves out (it starts at the key's name and stops at the
    value's end): ``"model='x'"`` for the engine line's ``model='x'`` (was ``"model='x"``), ``"'model': 'x'"``
    for an args dict's; in Python's repr, so the outer quotes never clash with the inner ones."""
    shown = m.group(0).strip()
    start = m.start() + len(m.group(0)) - len(m.group(0).lstrip())
    end = start + len(shown)
    if start and text[start - 1] in "'\"" and text[start - 1] in shown:  # the key's opening quote
        shown = text[start - 1] + shown
    if text[end : end + 1] in ("'", '"') and shown.count(text[end]) % 2:  # the value's closing quote
        shown += text[end]
    return repr(shown)


def stated_at(text: str, key: str) -> str | None:
    """Where ``text`` (a log :func:`read_vllm_log` reads) first states the setting ``key`` of :data:`LOG_LINES`
    (``"line 3, '--max-model-len 4096'"``), or None where it does not (an unset ``None`` or ``auto`` is not a
    statement); ``max_model_len`` is also stated by the concurrency line's L, which vLLM prints it as.

    Raises:
        KeyError: ``key`` is not a figure of :data:`LOG_LINES`.
        ValueError: the value on that line cannot be read (as :func:`read_vllm_log` raises).
    """
    for name in (key, PER_START) if key == "max_model_len" else (key,):
        for m in log_matches(text, name):
            if _figure(name, m, text) is not None:
                return f"line {text.count(chr(10), 0, m.start()) + 1}, {quoted_statement(m, text)}"
    return None


def _report_style(log: Mapping) -> str:
    version = log.get("vllm_version")
    if version is None:
        return "blocks"
    major, minor = (int(p) for p in version.split(".")[:2])
    return "concurrency" if (major, minor) >= (0, 21) else "blocks"


def _line(name: str, logged: float | None, predicted: float | None, how: str) -> dict:
    error = None
    if logged and predicted is not None:
        error = 100.0 * (predicted - logged) / logged
    return {"line": name, "log": logged, "kvlab": predicted, "error_pct": error, "how": how}


def _settings(
    log: Mapping, spec: ModelSpec, max_model_len, total, entrypoint, block_size, tp_given=None
) -> tuple[dict, int, list[str]]:
    """``(vllm_kv_cache keyword arguments, max_num_seqs, notes)``: the log's settings, the caller's
    (``max_model_len``, ``block_size``, ``tp_given``) or kvlab's defaults where it is silent (each noted)."""
    tp = int(log.get("tensor_parallel_size", 1 if tp_given is None else tp_given))
    block = int(log.get("block_size", 16 if block_size is None else block_size))
    length = int(
        log.get("max_model_len")
        or log.get("max_concurrency_tokens")
        or max_model_len
        or spec.context_limit  # vLLM's derived max_model_len, rope_scaling included
        or 4096
    )
    entry = entrypoint or ("v0" if "engine_v0" in log else "serve")
    nbt, seqs = scheduler_defaults(int((total or 0) * GIB), entry, length)
    nbt = int(log.get("max_num_batched_tokens", nbt))
    silent = {
        "model_dtype": spec.dtype,  # noted only where the log is silent: then the config's
        "block_size": block,
        "tensor_parallel_size": tp,
        "max_model_len": length,
        "max_num_batched_tokens": nbt,
    }
    stated = {*log, *(["max_model_len"] if "max_concurrency_tokens" in log else [])}  # the concurrency line's L
    given = {  # the caller's values, named by the flags of kvlab plan --from-log that give them
        key: f"{flag} {value}"
        for key, flag, value in (
            ("block_size", "--block-size", block_size),
            ("tensor_parallel_size", "--tp", tp_given),
            ("max_model_len", "--context", max_model_len),
        )
        if value is not None
    }
    notes = [  # 20,000 tokens as every other count kvlab prints, not 20000
        f"{k} not in the log: {given.get(k, f'kvlab assumes {v:,}' if isinstance(v, int) else f'kvlab assumes {v}')}"
        for k, v in silent.items()
        if k not in stated
    ]
    kv_kw = dict(
        max_model_len=length,
        tp=tp,
        dcp=int(log.get("decode_context_parallel_size", 1)),
        block_size=block,
        max_num_batched_tokens=nbt,
        kv_cache_dtype=str(log.get("kv_cache_dtype", "auto")),
        report=_report_style(log),
    )
    return kv_kw, seqs, notes


def _check_logged_tp(log: Mapping, spec: ModelSpec, tp: int | None = None) -> None:
    """Raise naming the log's ``tensor_parallel_size`` (not kvlab's ``--tp``, which ``--from-log`` refuses where
    the log states the size) where it does not split ``spec``'s heads: vLLM refuses a size not dividing the
    attention heads (``vllm/config/model.py``, ``ModelConfig.verify_with_parallel_config``) and shards or replicates
    whole KV heads (:func:`kvlab.plan.ledger.kv_heads_per_rank`, whose checks these are). Where the log is silent,
    the caller's ``tp`` is checked the same way, its error naming `` `tp` ``."""
    if "tensor_parallel_size" not in log:
        if tp is not None:
            kv_heads_per_rank(spec, tp)
        return
    try:
        kv_heads_per_rank(spec, int(log["tensor_parallel_size"]))
    except ValueError as e:
        raise ValueError(str(e).replace("`tp`", "the log's tensor_parallel_size", 1)) from None


def _logged_dtype(log: Mapping, spec: ModelSpec) -> tuple[ModelSpec, list[str]]:
    """``(spec, notes)``: ``spec`` in the model dtype the log states (``dtype=torch.float32`` in the engine config
    line, ``--dtype``), as vLLM's KV ``auto`` and its activations are in that dtype whatever the config says; a
    note when it is not the config's."""
    if log.get("model_dtype", spec.dtype) == spec.dtype:
        return spec, []
    note = f"model dtype {log['model_dtype']} from the log (the config says {spec.dtype}): KV auto is {log['model_dtype']}"
    return dataclasses.replace(spec, dtype=log["model_dtype"]), [note]


def _memory_lines(
    log: Mapping, spec: ModelSpec, config: Mapping, total: float, kv_kw: dict, seqs: int, weights: int | None
):
    """``(lines, terms, notes)`` of the KV memory prediction: each term beside the log's figure (the weights the
    log states, else ``weights``, bytes per GPU given by the caller)."""
    terms = available_kv_memory(
        config,
        spec,
        total_bytes=int(total * GIB),
        total_source="log" if "total_gib" in log else "given",
        gpu_memory_utilization=float(log["gpu_memory_utilization"]),
        weight_bytes=int(log["weights_gib"] * GIB) if "weights_gib" in log else int(weights or 0),
        weight_source="log" if "weights_gib" in log else "given",
        tp=kv_kw["tp"],
        max_num_batched_tokens=kv_kw["max_num_batched_tokens"],
        max_num_seqs=seqs,
    )
    logged = {
        "weights": log.get("weights_gib"),
        "activation_peak": log.get("activation_gib"),
        "non_torch": log.get("non_torch_gib"),
    }
    lines = [_line(t.name, logged.get(t.name), t.bytes / GIB, t.assumes) for t in terms[1:-1]]
    predicted = terms[-1].bytes
    lines.append(
        _line(
            "Available KV cache memory (GiB)",
            log.get("available_kv_cache_gib"),
            predicted / GIB,
            "budget - the terms",
        )
    )
    notes = []
    if predicted <= 0:
        notes.append(f"does not fit: {-predicted / GIB:.2f} GiB short of any KV cache at this utilization")
    return lines, terms, notes


def _kv_lines(log: Mapping, spec: ModelSpec, kv_kw: dict) -> tuple[list[dict], list[str]]:
    """The tokens and concurrency lines from the log's own KV memory."""
    kv = vllm_kv_cache(spec, int(log["available_kv_cache_gib"] * GIB), **kv_kw)
    logged_tokens = log.get("gpu_kv_cache_tokens")
    if logged_tokens is None and "num_gpu_blocks" in log:
        logged_tokens = log["num_gpu_blocks"] * kv_kw["block_size"]
    lines = [
        _line(
            "GPU KV cache size (tokens, from the log's KV memory)",
            logged_tokens,
            kv.kv_cache_tokens,
            f"{kv.num_blocks:,} blocks, {len(kv.groups)} group{'' if len(kv.groups) == 1 else 's'} ({kv.report})",
        ),
        _line(
            f"Maximum concurrency for {kv_kw['max_model_len']:,} tokens",
            log.get("max_concurrency"),
            kv.max_concurrency,
            f"{kv.num_blocks:,} blocks / blocks per request",
        ),
    ]
    return lines, list(kv.notes)


def explain_vllm_log(
    log: Mapping,
    spec: ModelSpec,
    config: Mapping,
    *,
    max_model_len: int | None = None,
    total_gib: float | None = None,
    entrypoint: str | None = None,
    block_size: int | None = None,
    tp: int | None = None,
    weight_bytes: int | None = None,
) -> dict[str, Any]:
    """kvlab's prediction beside each KV figure of ``log`` (from :func:`read_vllm_log`).

    ``max_model_len``/``total_gib``/``entrypoint``/``block_size``/``tp``/``weight_bytes`` (one GPU's share, bytes)
    stand in where the log is silent (defaults: the log's ``max_model_len`` or concurrency line's L, else the
    config's limit; no memory prediction without a total or without weights; ``serve``, or ``v0`` for a V0 log; 16
    tokens per block, vLLM's CUDA default; 1 GPU), each noted. Returns ``{"lines": [...], "terms": [...], "settings": {...},
    "notes": [...]}``; a ``does not fit`` note with the shortfall when the predicted KV memory is not positive, and
    a note naming the values of each KV figure the log gave more than once (``per_worker``, :func:`read_vllm_log`).

    Raises:
        ValueError: the log's tensor_parallel_size (or ``tp`` where the log states none) does not split the model's
            heads (:func:`_check_logged_tp`); ``max_model_len`` or ``tp`` given and not a whole number >= 1;
            ``total_gib`` given and not a finite number > 0 (:func:`kvlab.plan.fit.check_memory_gib`); or
            nothing to explain: ``log`` has no KV memory and lacks a fact the memory prediction needs
            (:func:`read_vllm_log` refuses such a log first).
    """
    if total_gib is not None:  # inf was an OverflowError, nan "cannot convert float NaN to integer"
        check_memory_gib(total_gib, "total_gib")
    total = log.get("total_gib", total_gib)
    if max_model_len is not None:  # 0 was read as not given (the config's limit), not refused
        check_int_at_least("max_model_len", max_model_len, 1, flag="--context")
    _check_logged_tp(log, spec, tp)
    spec, dtype_notes = _logged_dtype(log, spec)
    kv_kw, seqs, notes = _settings(log, spec, max_model_len, total, entrypoint, block_size, tp)
    notes += dtype_notes
    for key, values in log.get("per_worker", {}).items():
        words, unit = PER_WORKER[key]
        notes.append(
            f"{len(values)} '{words}' lines ({', '.join(f'{v:,}' for v in values)}{unit}), one per worker: kvlab "
            f"takes the smallest, {min(values):,}{unit}, as vLLM sizes every worker's KV cache by the smallest (a "
            "file with more than one start of vLLM: keep one start's lines)"
        )
    lines, terms, missing = [], [], [
        what
        for what, known in (
            ("the device memory (or --gpu-mem-gib, --gpu)", total is not None),
            ("the utilization", "gpu_memory_utilization" in log),
            ("the weights (or --weight-bytes, --weight-dtype, --weights-index)", "weights_gib" in log or weight_bytes is not None),
        )
        if not known
    ]
    if not missing:
        lines, terms, more = _memory_lines(log, spec, config, total, kv_kw, seqs, weight_bytes)
        notes += more
    else:
        notes.append(f"no memory prediction: the log does not state {', '.join(missing)}")
    if log.get("available_kv_cache_gib") is not None:
        more_lines, more = _kv_lines(log, spec, kv_kw)
        lines += more_lines
        notes += more
    elif missing:  # an empty table, exit 0, was the answer
        raise ValueError(f"nothing to explain: no {_NEEDED}, and the log does not state {', '.join(missing)}")
    return {"lines": lines, "terms": [t.to_dict() for t in terms], "settings": kv_kw, "notes": notes}
