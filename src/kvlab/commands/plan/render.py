"""Human output of the planner's reports (rich tables), built from the report dicts of :mod:`kvlab.plan.report`
alone, as :mod:`kvlab.eval.render` renders an eval result: ``kvlab plan``'s ledger, fit and decode bound, its
``--emit vllm`` script, ``kvlab roofline``'s tables, ``kvlab video``'s clips, and the preset and GPU listings."""

from __future__ import annotations

import argparse
import json

from kvlab.commands import table
from kvlab.runtime.console import stdout_console

GIB = 1024**3


def _rate(x: float) -> str:
    """A tokens/s figure: one decimal, or three significant digits below 0.1 (``1.2e-09``, not ``0.0``)."""
    return f"{x:,.1f}" if x == 0 or x >= 0.1 else f"{x:.3g}"


def _gib(n: float | int | None) -> str:
    """Binary units (KiB/MiB/GiB = 2^10/2^20/2^30 B), GiB from 1 GiB up."""
    if n is None:
        return "-"
    if n == 0:
        return "0 B"
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size or unit == "KiB":
            return f"{n / size:,.2f} {unit}"
    raise AssertionError("unreachable")


def _gb(n: float | int | None) -> str:
    return "-" if n is None else f"{n / 1e9:,.2f} GB"


def _bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    return f"{n:,} B" if float(n).is_integer() else f"{n:,.2f} B"


def _print_report(r: dict, *parts) -> None:
    """A report's tables and lines (``parts``, in order) on stdout, then its notes, one ``  note: ...`` line each."""
    console = stdout_console()
    for part in parts:
        console.print(part)
    for note in r["notes"]:
        console.print(f"  note: {note}")


def print_lists(args: argparse.Namespace) -> bool:
    """Print what ``--list-presets`` / ``--list-gpus`` ask for (both when both are given), as tables or, with
    ``--json``, as one JSON object (``presets``, ``gpus``); True when anything was listed."""

    want_presets, want_gpus = getattr(args, "list_presets", False), getattr(args, "list_gpus", False)
    if not (want_presets or want_gpus):
        return False
    from kvlab.plan import presets
    from kvlab.plan.hardware import HARDWARE

    if getattr(args, "json", False):
        listing = {}
        if want_presets:
            listing["presets"] = [
                {"name": p.name, "hub_id": p.hub_id, "exercises": p.why, "config_url": p.source_url}
                for p in presets.PRESETS.values()
            ]
        if want_gpus:
            listing["gpus"] = [h.to_dict() for h in HARDWARE]
        print(json.dumps(listing, indent=1))
        return True
    if want_presets:
        t = table(
            "Built-in presets (fields from each hub config.json)", labels=("name", "hub id", "exercises")
        )
        for preset in presets.PRESETS.values():
            t.add_row(preset.name, preset.hub_id, preset.why)
        stdout_console().print(t)
    if want_gpus:
        t = table(
            "Hardware table (datasheets: dense 16-bit tensor FLOP/s, TB/s = 1e12 B/s; memory as the device "
            "reports it, MiB = 2^20 B)",
            *("TFLOP/s", "TB/s", "memory MiB", "GiB", "ridge FLOP/B"),
            labels=("name",),
        )
        for col in ("note", "datasheet", "memory read from"):
            t.add_column(col)
        for h in HARDWARE:
            t.add_row(
                h.name,
                f"{h.tflops_16bit:g}",
                f"{h.bandwidth_tb_s:g}",
                f"{h.memory_mib:,}",
                f"{h.memory_gib:.2f}",
                f"{h.ridge_flop_per_byte:.1f}",
                h.note,
                h.source,
                h.memory_source,
            )
        stdout_console().print(t)
    return True


def print_vllm(r: dict) -> None:
    """The command on one line, then what it means as ``#`` comments: the output is a runnable shell script."""
    v = r["vllm"]
    if v.get("closest"):
        print(f"# {v['closest']}")
    print(v["command_line"])
    pages = v.get("layer_pages") or []
    if len(pages) > 1:  # skipped layers: one pool per layer, a block spans every layer
        spans = " and ".join(
            f"{p['layers']} layer{'s' if p['layers'] > 1 else ''} of {p['page_size_bytes']:,} B"
            for p in pages
        )
        blocks = f"{v['num_gpu_blocks']:,} blocks of {v['block_size']} tokens, each spanning {spans}"
    else:
        blocks = (
            f"{v['num_gpu_blocks']:,} blocks of {v['block_size']} tokens x {v['num_layers']} layers, "
            f"{v['page_size_bytes']:,} B per block and layer"
        )
    print(f"# KV cache per GPU, at most (before vLLM's activation deductions): {v['kv_cache_tokens']:,} tokens ({blocks})")
    print(
        f"# from {_gib(v['kv_memory_bytes_per_gpu'])} of KV memory = {v['gpu_memory_utilization']:g} x "
        f"{_gib(v['memory_bytes'])} - {_gib(v['weight_bytes_per_gpu'])} weights per GPU [GiB = 2^30 B]"
    )
    print(
        f"# maximum concurrency for {v['max_model_len']:,} tokens per request: {v['max_concurrency']:.2f}x "
        f"(the plan: {r['kv_bytes_per_token_per_gpu']:,} KV B/token/GPU, max batch {r['max_batch']:,})"
    )
    p = v["predicted_log"]
    print("# with vLLM's profiled activations (docs/plan.md, vLLM's startup log), its log would say:")
    for t in p["terms"][1:-1]:
        print(f"#   {t['name']}: {_gib(t['bytes'])} ({t['assumes']})")
    if p["fits"]:
        print(f"#   Available KV cache memory: {p['terms'][-1]['gib']:.2f} GiB")
        print(f"#   GPU KV cache size: {p['kv_cache_tokens']:,} tokens")
        print(
            f"#   Maximum concurrency for {v['max_model_len']:,} tokens per request: {p['max_concurrency']:.2f}x"
        )
    else:
        print(f"#   does not fit: {_gib(p['shortfall_bytes'])} short of any KV cache at this utilization")
    for note in v["notes"]:
        print(f"# note: {note}")


def print_plan(r: dict) -> None:
    """``kvlab plan``'s tables of the report ``r`` (:func:`kvlab.plan.report.plan_report`): KV per layer kind, then
    the ledger, fit and decode bound, and its notes."""
    s = r["spec"]
    kinds = ", ".join(f"{n} {k}" for k, n in s["layer_kinds"].items())
    heads = (
        f"MLA latent {s['mla_latent_dim']}"
        if s["mla_latent_dim"]
        else (f"{s['num_attention_heads']} q / {s['num_kv_heads']} KV heads x {s['head_dim']}")
    )
    kvd = r["kv_dtype"]
    cap = "" if kvd["keep_tokens"] is None else f" keeping at most {kvd['keep_tokens']:,} tokens"
    t = table(
        f"{r['model']}: {s['num_layers']} layers ({kinds}), {heads}; KV {kvd.get('cache_name', kvd['name'])}{cap}, "
        f"batch {r['batch']:,} x {r['context']:,} tokens, tp {r['tp']}  [GiB = 2^30 B, GB = 1e9 B]",
        *("layers", "tokens kept", "KV B/token/GPU", "KV theoretical/GPU", "KV allocated/GPU"),
        labels=("layer kind",),
    )
    for row in r["by_layer_kind"]:
        t.add_row(
            row["kind"],
            str(row["layers"]),
            f"{row['tokens_stored']:,}",
            _bytes(row["kv_bytes_per_token_per_gpu"]),
            _gib(row["kv_bytes_theoretical_per_gpu"]),
            _gib(row["kv_bytes_allocated_per_gpu"]),
        )
    _print_report(r, t, _ledger_table(r))


def _ledger_table(r: dict):
    """The plan's second table: KV bytes (per GPU and summed with tp > 1), weights, fit, decode bound."""

    t = table("Ledger, fit and decode bound", "value", "also", labels=("quantity",))
    tp = r["tp"]
    # with tp > 1 each KV quantity is shown for one GPU and summed over all tp GPUs (a replica counts on each)
    scopes = [("", "")] if tp == 1 else [(", per GPU", "_per_gpu"), (f", all {tp} GPUs", "")]
    for scope, suffix in scopes:
        per_token = r[f"kv_bytes_per_token{suffix}"]
        also = f"{per_token / 1024:,.2f} KiB" + (f" = {tp} x per GPU" if tp > 1 and not suffix else "")
        t.add_row(f"KV bytes per token{scope}", _bytes(per_token), also)
    for scope, suffix in scopes:
        total = r["kv_bytes_total" + suffix]
        t.add_row(f"KV total, theoretical{scope}", _gib(total), _gb(total))
    _add_metadata_row(t, r)
    for scope, suffix in scopes:
        allocated = r["kv_bytes_allocated_per_gpu" if suffix else "kv_bytes_total_allocated"]
        t.add_row(f"KV total, engine-allocated{scope}", _gib(allocated), _gb(allocated))
    t.add_row("weights", _gib(r["weight_bytes"]), r["weight_bytes_source"])
    if r["kv_to_weight_ratio"] is not None:
        t.add_row("KV / weights", f"{r['kv_to_weight_ratio']:,.2f}x", "")
    _add_fit_rows(t, r)
    _add_bound_rows(t, r)
    return t


def _add_metadata_row(t, r: dict) -> None:
    """The quantization metadata inside the theoretical total: KIVI scale/zero pairs or FP8 scales (none for a
    plain dtype or unscaled FP8)."""
    kvd, meta = r["kv_dtype"], r["kv_metadata_bytes_total"]
    if kvd["nbits"] is not None:
        label = f"of which scales/zeros ({kvd['metadata_bytes']} B each)"
    elif kvd["fp8_scale"] not in (None, "none"):
        label = f"of which FP8 scales ({kvd['fp8_scale']}, fp32)"
    else:
        return
    pct = 100.0 * meta / r["kv_bytes_total"] if r["kv_bytes_total"] else 0.0
    share = f"{pct:.2f}%" if pct >= 0.01 or pct == 0 else f"{pct:.1e}%"
    scope = "" if r["tp"] == 1 else ", all GPUs"
    t.add_row(label, _bytes(meta), f"{_gib(meta)}; {share} of the KV total{scope}")


def _add_fit_rows(t, r: dict) -> None:
    """Rows of the GPU budget and what fits in it, or one row saying what the fit needs."""
    if r["fits"] is not None:
        b = r["budget"]
        t.add_row("GPU memory", _gib(b["memory_bytes"]), b["source"])
        t.add_row("reserve (--reserve-gib)", _gib(b["reserve_bytes"]), "")
        t.add_row(
            "left for KV per GPU", _gib(r["kv_budget_bytes_per_gpu"]), _gb(r["kv_budget_bytes_per_gpu"])
        )
        t.add_row(f"fits batch {r['batch']:,} x {r['context']:,}", "yes" if r["fits"] else "no", "")
        t.add_row(
            f"max batch at {r['context']:,} tokens",
            f"{r['max_batch']:,}",
            f"engine-allocated: {r['max_batch_allocated']:,}",
        )
        keep = r["kv_dtype"]["keep_tokens"]
        if r["max_context"] is not None:
            mc = f"{r['max_context']:,} tokens"
        elif keep is not None:
            mc = f"not limited by KV (the cache keeps at most {keep:,} tokens)"
        else:
            mc = "not limited by memory"
        mca = "not limited" if r["max_context_allocated"] is None else f"{r['max_context_allocated']:,}"
        limit = r["spec"]["context_limit"]
        also = f"engine-allocated: {mca}" + (
            f"; config limit {limit:,}" if r["max_context_above_model_limit"] else ""
        )
        t.add_row(f"max context at batch {r['batch']:,}", mc, also)
    else:
        t.add_row("fit", "-", "needs GPU memory (--gpu-mem-gib) and weight bytes")


def _add_bound_rows(t, r: dict) -> None:
    """Rows of the decode step lower bound, the decode attention intensity and a measured step."""
    gpu = r["gpu"]
    if r["decode_step_lower_bound_ms"] is not None:
        t.add_row(
            f"decode step lower bound ({gpu['name']})",
            f"{r['decode_step_lower_bound_ms']:,.3f} ms",
            f"{r['limiter']}-bound; {r['bytes_per_step'] / GIB:,.2f} GiB per step",
        )
        t.add_row("tokens/s upper bound", _rate(r["tokens_per_s_upper_bound"]), f"batch {r['batch']:,}")
    t.add_row(
        "decode attention intensity",
        f"{r['decode_attention_intensity']:.2f} FLOP/B",
        "ridge "
        + ("-" if gpu["ridge_flop_per_byte"] is None else f"{gpu['ridge_flop_per_byte']:.1f} FLOP/B"),
    )
    _add_measured_row(t, r["measured"])


def _bound_cell(bound: str | None) -> str:
    """``memory-bound`` / ``compute-bound``, or why there is no verdict: no ridge point without a compute peak
    (``--bandwidth-gb-s`` alone; the table printed ``--bound`` once)."""
    return f"{bound}-bound" if bound else "- (no peak FLOP/s: no ridge)"


def print_roofline(r: dict) -> None:
    """``kvlab roofline``'s tables of the report ``r`` (:func:`kvlab.plan.report.roofline_report`): the roofline
    quantities, the ideal decode intensity per GQA ratio (with ``--probe``, this machine's), and its notes."""
    g = r["gpu"]
    t = table(f"Roofline: {g['name']}", "value", labels=("quantity",), caption=f"source: {g['source']}")
    t.add_column("note")
    t.add_row(
        "peak dense 16-bit", "-" if g["tflops_16bit"] is None else f"{g['tflops_16bit']:g} TFLOP/s", g["note"]
    )
    t.add_row("memory bandwidth", f"{g['bandwidth_tb_s']:g} TB/s", "1 TB = 1e12 B")
    t.add_row(
        "ridge point",
        "-" if r["ridge_flop_per_byte"] is None else f"{r['ridge_flop_per_byte']:.1f} FLOP/B",
        "peak / bandwidth",
    )
    t.add_row(
        f"decode attention intensity ({r['model']})",
        f"{r['decode_attention_intensity']:.2f} FLOP/B",
        f"I = 2g/p, KV {r['kv_dtype'].get('cache_name', r['kv_dtype']['name'])}",
    )
    if r["kv_dtype"]["keep_tokens"] is not None:
        kept = min(r["context"], r["kv_dtype"]["keep_tokens"])  # a cap above the context keeps every token
        t.add_row(
            "KV kept per layer",
            f"{kept:,} tokens",
            f"--keep-tokens {r['kv_dtype']['keep_tokens']:,}: a capped cache at --context {r['context']:,}",
        )
    if r["prefill"] is not None:
        p = r["prefill"]
        t.add_row(
            f"prefill intensity (S = {p['seq_len']:,})",
            f"{p['intensity_flop_per_byte']:.1f} FLOP/B",
            "rough model: (2NS + causal attention) FLOPs over weights + 10 S D p bytes per layer",
        )
    if r["decode_step_lower_bound_ms"] is not None:
        t.add_row(
            f"decode step lower bound (batch {r['batch']:,}, {r['context']:,} tokens)",
            f"{r['decode_step_lower_bound_ms']:,.3f} ms",
            f"{r['bytes_per_step']:,} B per step ({r['bytes_per_step'] / GIB:,.2f} GiB), {r['limiter']}-bound",
        )
        t.add_row("tokens/s upper bound", _rate(r["tokens_per_s_upper_bound"]), "batch / step bound")
    _add_measured_row(t, r["measured"])

    ideal = table(
        f"Ideal decode attention intensity I = 2g/p (p = {r['kv_dtype']['bytes_per_element']:g} B)",
        *("g = n_q / n_kv", "I (FLOP/B)", f"{g['name']}"),
    )
    probe = r["probe"]
    if probe:
        ideal.add_column("this machine, fp32", justify="right")
    for i, row in enumerate(r["decode_intensity_table"]):
        cells = [str(row["g"]), f"{row['intensity_flop_per_byte']:.1f}", _bound_cell(row["bound"])]
        if probe:
            local = probe["decode_intensity_table"][i]
            cells.append(f"I = {local['intensity_flop_per_byte']:.1f}: {local['bound']}-bound")
        ideal.add_row(*cells)
    parts = [t, ideal]
    if probe:
        parts.append(
            f"  probe (numpy fp32, {probe['cpu_count']} CPUs, {probe['probe_seconds']:.1f} s): "
            f"{probe['peak_gflops']:.2f} GFLOP/s (matmul n={probe['matmul_n']}), "
            f"{probe['bandwidth_gb_s']:.2f} GB/s (streaming), ridge {probe['ridge_flop_per_byte']:.2f} FLOP/B"
        )
        parts += [f"  [yellow]warning: {w}[/]" for w in probe.get("warnings") or ()]
    _print_report(r, *parts)


def print_video(r: dict) -> None:
    """``kvlab video``'s table: one row per clip (frames, latent frames, tokens, KV bytes)."""
    c0 = r["clips"][0]
    t = table(
        f"Video KV on {r['model']} ({r['kv_dtype'].get('cache_name', r['kv_dtype']['name'])}): {c0['width']}x{c0['height']}, "
        f"{c0['temporal_compression']}x time, {c0['spatial_compression']}x{c0['spatial_compression']} space, "
        f"patch {c0['patch_size']}, whole history kept  [GiB = 2^30 B]",
        *("seconds", "frames", "latent frames", "tokens/frame", "tokens", "KV", "KV first latent frame"),
    )
    for c in r["clips"]:
        t.add_row(
            f"{c['seconds']:g}",
            f"{c['frames']:,}" + (f" ({c['frames_used']:,} used)" if c.get("frames_used", c["frames"]) != c["frames"] else ""),
            f"{c['latent_frames']:,}",
            f"{c['tokens_per_frame']:,}",
            f"{c['tokens']:,}",
            _gib(c["kv_bytes"]),
            _gib(c["kv_bytes_first_latent_frame"]),
        )
    _print_report(r, t)


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_from_log(r: dict) -> None:
    """``kvlab plan --from-log``: one row per KV line of the log with kvlab's figure and the error, then the
    settings the prediction used and what it assumed."""
    t = table(
        f"{r['log_file']}: vLLM's startup log beside kvlab's model of {r['model']}  [GiB = 2^30 B]",
        *("log", "kvlab", "error"),
        labels=("line",),
    )
    t.add_column("how kvlab gets it")
    for line in r["lines"]:
        fmt = ",.0f" if "tokens" in line["line"] and "concurrency" not in line["line"].lower() else ",.2f"
        t.add_row(
            line["line"],
            _cell(line["log"], fmt),
            _cell(line["kvlab"], fmt),
            _cell(line["error_pct"], "+.1f") + ("%" if line["error_pct"] is not None else ""),
            line["how"],
        )
    s = r["settings"]
    settings = (
        f"  settings: tp {s['tp']}, dcp {s['dcp']}, block size {s['block_size']}, KV dtype {s['kv_cache_dtype']}, "
        f"max_model_len {s['max_model_len']:,}, max_num_batched_tokens {s['max_num_batched_tokens']:,}, "
        f"tokens counted as vLLM's '{s['report']}' report"
    )
    _print_report(r, t, settings)


def print_mixed_plan(r: dict) -> None:
    """A per-layer plan's report (:func:`kvlab.plan.mixed_report.mixed_plan_report`): its layers grouped by
    format, then KV bytes per token, per request and in total, and the fit."""
    kvd, tp = r["kv_dtype"], r["tp"]
    t = table(
        f"{r['model']}: plan {kvd['plan']} ({kvd['plan_source']}), batch {r['batch']:,} x {r['context']:,} "
        f"tokens, tp {tp}, KIVI G={kvd['group_size']} R={kvd['residual_length']}  [GiB = 2^30 B]",
        "KV B/layer/GPU at context",
        labels=("keys", "values", "layers"),
    )
    groups: dict[tuple[str, str], list[int]] = {}
    for row in r["plan_layers"]:
        groups.setdefault((row["k"], row["v"]), []).append(row["layer"])
    per_layer = r["kv_bytes_per_layer_per_gpu"]
    for (k, v), layers in groups.items():
        sizes = sorted({per_layer[i] for i in layers})
        t.add_row(k, v, _layer_list(layers), " / ".join(f"{n:,} B" for n in sizes))
    q = table("Ledger and fit (per GPU)", "value", "also", labels=("quantity",))
    per_token = r["kv_bytes_per_token_per_gpu"]
    q.add_row("KV bytes per token", _bytes(per_token), f"{per_token / 1024:,.2f} KiB (long-context)")
    q.add_row(f"KV per request ({r['context']:,} tokens)", _bytes(r["kv_bytes_per_request_per_gpu"]), "")
    total = r["kv_bytes_total_per_gpu"]
    q.add_row(f"KV total (batch {r['batch']:,})", _bytes(total), _gib(total))
    q.add_row("KV peak while decoding", _bytes(r["kv_bytes_peak_per_gpu"]), "")
    q.add_row("weights", _gib(r["weight_bytes"]), r["weight_bytes_source"] or "")
    if r["fits"] is None:
        q.add_row("fit", "-", "needs GPU memory (--gpu-mem-gib) and weight bytes")
    else:
        q.add_row("left for KV", _gib(r["kv_budget_bytes_per_gpu"]), _gb(r["kv_budget_bytes_per_gpu"]))
        q.add_row(f"fits batch {r['batch']:,} x {r['context']:,}", "yes" if r["fits"] else "no", "")
        q.add_row(f"max batch at {r['context']:,} tokens", f"{r['max_batch']:,}", "")
        q.add_row(f"max context at batch {r['batch']:,}", f"{r['max_context']:,} tokens", "")
    _print_report(r, t, q)


def _layer_list(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _add_measured_row(t, m: dict | None) -> None:
    """The ``--measured-step-ms`` row of a plan or roofline table (nothing without a measured step)."""
    if m:
        t.add_row(
            "measured step",
            f"{m['measured_step_ms']:,.3f} ms",
            f"{m['fraction_of_bound']:.1%} of bound; {m['achieved_bandwidth_gb_s']:,.1f} GB/s achieved"
            + ("; FASTER THAN THE BOUND: see the warning" if m["faster_than_bound"] else ""),
        )
