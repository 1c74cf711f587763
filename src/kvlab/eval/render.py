"""Human summary of an eval result (rich tables), built from the result dict alone."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvlab.eval.decision import BYTE_TIE

MIB = 1024**2


def _f(value, fmt: str, none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def _mark(row: dict, gate: str) -> str:
    gates = row.get("gates", {})
    g = gates.get(gate)
    if g is None:  # "?": a gate present but not used (latency timed on a busy machine); blank: no such gate
        return " [yellow]?[/]" if gate in gates else ""
    return " [green]✓[/]" if g else " [red]✗[/]"


# the matrix columns: (header, the row key whose presence in some row shows it, or None for always shown)
MATRIX_COLUMNS = (
    ("ctx", None),
    ("candidate", None),
    ("R/G", None),
    ("cache MiB", None),
    ("× dyn", None),
    ("ms/tok", None),
    ("lat ×", None),
    ("NLL / Δ", None),
    ("top-k", None),
    ("agree", None),
    # long-context columns only when some row has them (results written before them, or --no-long-context)
    ("recall", "recall_accuracy"),
    ("passkey", "passkey_accuracy"),
    ("KL", "kl_mean"),
    ("peak MiB", None),
    ("verdict", None),
)
MATRIX_TITLES = {"capacity": "Capacity matrix (contexts x candidates)", "window": "Residual-window matrix"}
KEY_COLUMNS = 2  # ctx and candidate: repeated in every part of a table split to fit the width
_LEFT = ("candidate", "verdict")


def _matrix_cells(r: dict) -> tuple[str, ...]:
    """One row's cells, in :data:`MATRIX_COLUMNS` order (rich markup for the gate marks)."""
    base = r["candidate"] == "dynamic"
    rg = "" if base else f"{_f(r.get('residual_length'), 'd')}/{_f(r.get('group_size'), 'd')}"
    peak = r.get("incremental_peak_bytes")
    return (
        str(r["context_length"]),
        r["candidate"],
        rg,
        _f(r["cache_bytes"] / MIB, ".3f"),
        "1" if base else _f(r.get("cache_bytes_ratio"), ".3f") + _mark(r, "saves_memory"),
        _f(r["ms_per_token"], ".1f"),
        "1" if base else _f(r.get("latency_ratio"), ".2f") + _mark(r, "latency_ratio"),
        _f(r.get("mean_nll"), ".3f") if base else _f(r.get("nll_delta"), "+.3f") + _mark(r, "nll_delta"),
        "" if base else _f(r.get("topk_overlap"), ".2f") + _mark(r, "topk_overlap"),
        "" if base else _f(r.get("token_agreement_rate"), ".2f"),
        _f(r.get("recall_accuracy"), ".3f") + _mark(r, "recall_drop"),
        _f(r.get("passkey_accuracy"), ".2f") + _mark(r, "passkey_drop"),
        "" if base else _f(r.get("kl_mean"), ".4f") + _mark(r, "kl_mean"),
        _f(None if peak is None else peak / MIB, ".1f"),
        "baseline" if base else ("[green]eligible[/]" if r.get("eligible") else "[red]rejected[/]"),
    )


def _matrix_grid(result: dict, matrix: str) -> tuple[str, list[str], list[list[str]]] | None:
    """``(title, headers, rows of cells)`` of one matrix, a row per cell and the baseline first at each context;
    None when the matrix has no row."""
    rows = [r for r in result["rows"] if r["matrix"] == matrix]
    if not rows:
        return None
    keep = [
        i
        for i, (_, key) in enumerate(MATRIX_COLUMNS)
        if key is None or any(r.get(key) is not None for r in rows)
    ]
    cells = [_matrix_cells(r) for r in rows]
    return (
        MATRIX_TITLES[matrix],
        [MATRIX_COLUMNS[i][0] for i in keep],
        [[c[i] for i in keep] for c in cells],
    )


def _cell_width(text: str) -> int:
    return max((Text.from_markup(line).cell_len for line in text.split("\n")), default=0)


def _table(title: str, headers: list[str], rows: list[list[str]], columns: list[int]) -> Table:
    """A rich table of ``columns`` of the grid. The candidate column never wraps (a cache name folded over lines
    read as cut: "sink:sink_to"), and its width is its longest name."""
    t = Table(title=title)
    for i in columns:
        h = headers[i]
        width = max(_cell_width(h), *(_cell_width(r[i]) for r in rows)) if rows else _cell_width(h)
        t.add_column(
            h,
            justify="left" if h in _LEFT else "right",
            no_wrap=h == "candidate",
            min_width=width if h == "candidate" else None,
        )
    for r in rows:
        t.add_row(*[r[i] for i in columns])
    return t


def _greedy(widths: list[int], fixed: int, limit: int) -> list[list[int]]:
    """Columns (indices into ``widths``) in order, a new part whenever the next would pass ``limit`` characters with
    the ``fixed`` ones of the key columns; each part holds at least one column."""
    parts: list[list[int]] = [[]]
    used = fixed
    for i, w in enumerate(widths):
        if parts[-1] and used + w > limit:
            parts.append([])
            used = fixed
        parts[-1].append(i)
        used += w
    return parts


def _fit(grid: tuple[str, list[str], list[list[str]]], width: int | None) -> list[Table]:
    """The grid as one table, or, where it is wider than ``width`` unwrapped, as the fewest tables that each fit,
    their widths as even as the order allows: the data columns split in order, ctx and candidate repeated in every
    part, so that no cell is cut or wrapped. A part is never left without a data column (at a width too small
    even for that, rich shrinks the part)."""
    title, headers, rows = grid
    # a column's width unwrapped: its widest cell, one space each side and a border (rich's default box)
    span = [3 + max([_cell_width(h)] + [_cell_width(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fixed = 1 + sum(span[:KEY_COLUMNS])  # the key columns and the closing border
    keys, data = list(range(KEY_COLUMNS)), span[KEY_COLUMNS:]
    if width is None or fixed + sum(data) <= width:
        return [_table(title, headers, rows, keys + list(range(KEY_COLUMNS, len(headers))))]
    parts = _greedy(data, fixed, width)
    for limit in range(width - 1, 0, -1):  # the narrowest limit that still needs no more parts: even widths
        tighter = _greedy(data, fixed, limit)
        if len(tighter) > len(parts):
            break
        parts = tighter
    return [
        _table(f"{title}, part {n} of {len(parts)}", headers, rows, keys + [KEY_COLUMNS + i for i in part])
        for n, part in enumerate(parts, 1)
    ]


def matrix_table(result: dict, matrix: str) -> Table | None:
    """One table per matrix: a row per cell, the baseline first at each context (None when it has no row)."""
    grid = _matrix_grid(result, matrix)
    return None if grid is None else _fit(grid, None)[0]


def matrix_tables(result: dict, matrix: str, width: int | None) -> list[Table]:
    """:func:`matrix_table` split into parts that each fit ``width`` characters unwrapped (:func:`_fit`)."""
    grid = _matrix_grid(result, matrix)
    return [] if grid is None else _fit(grid, width)


def _passkey_grid(result: dict) -> tuple[str, list[str], list[list[str]]] | None:
    """Passkey retrieval per depth: correct / trials for every capacity row with the grid, and the mean accuracy
    with its Wilson 95 % interval over all trials; None when no row has it."""
    rows = [r for r in result["rows"] if r["matrix"] == "capacity" and isinstance(r.get("passkey"), dict)]
    if not rows:
        return None
    depths = sorted({d["depth"] for r in rows for d in r["passkey"]["depths"]})
    headers = ["ctx", "candidate", *[f"{100 * d:g} %" for d in depths], "mean", "95 % CI", "verdict"]
    cells = []
    for r in rows:
        by_depth = {d["depth"]: d for d in r["passkey"]["depths"]}
        counts = [
            f"{by_depth[d]['correct']}/{by_depth[d]['trials']}" if d in by_depth else "-" for d in depths
        ]
        lo, hi = r["passkey"].get("ci95") or (None, None)
        gate = r.get("gates", {}).get("passkey_drop")
        verdict = "" if gate is None else ("pass" if gate else "[red]fail[/]")
        cells.append(
            [
                str(r["context_length"]),
                r["candidate"],
                *counts,
                _f(r.get("passkey_accuracy"), ".2f"),
                f"{_f(lo, '.2f')}-{_f(hi, '.2f')}",
                "baseline" if r["candidate"] == "dynamic" else verdict,
            ]
        )
    return "Passkey retrieval (correct / trials per needle depth)", headers, cells


def passkey_table(result: dict) -> Table | None:
    """The passkey grid as one table (:func:`_passkey_grid`); None when no row has it."""
    grid = _passkey_grid(result)
    return None if grid is None else _fit(grid, None)[0]


def passkey_tables(result: dict, width: int | None) -> list[Table]:
    """:func:`passkey_table` split into parts that each fit ``width`` characters unwrapped (:func:`_fit`)."""
    grid = _passkey_grid(result)
    return [] if grid is None else _fit(grid, width)


def decision_rule(summary: dict) -> str | None:
    """How :func:`kvlab.eval.decision.decide` chose among several eligible rows, in words (None for one or none)."""
    n = summary.get("eligible_candidate_count", 0) if isinstance(summary, dict) else 0
    if n <= 1 or not summary.get("selected_candidate"):
        return None
    return (
        f"the rule: of the {n} rows that pass every gate, the one saving the most cache bytes; rows within "
        f"{BYTE_TIE:.0%} of those bytes tie, and a tie goes to the lower KL mean, then to the lower latency ratio"
    )


def fp8_range_lines(result: dict) -> list[str]:
    """One line per FP8 candidate of the capacity matrix: K/V elements clamped at the format's range and non-zero
    ones stored as zero (the rows' ``cache_counts``, :meth:`kvlab.caches.fp8.FP8Cache.counts`), summed over its
    contexts."""
    totals: dict[str, dict[str, int]] = {}
    for row in result.get("rows", []):
        counts = row.get("cache_counts") if row.get("matrix") == "capacity" else None
        if not counts or "elements" not in counts:
            continue
        t = totals.setdefault(row["candidate"], {})
        for key in ("key_saturated", "value_saturated", "key_underflow", "value_underflow", "elements"):
            t[key] = t.get(key, 0) + int(counts.get(key, 0))
    lines = []
    for name, t in totals.items():
        n = 2 * t["elements"]
        if not n:
            continue
        sat = t["key_saturated"] + t["value_saturated"]
        under = t["key_underflow"] + t["value_underflow"]
        lines.append(
            f"{name} range: {sat:,} of {n:,} K/V elements saturated ({sat / n:.4%}), {under:,} flushed to zero "
            f"({under / n:.4%}) as stored, all contexts"
        )
    return lines


# what each matrix column holds (printed once under the tables): a new user could not make ms/tok and lat × agree
COLUMN_LEGEND = (
    "columns: R/G = residual window R (newest tokens kept unquantized) / group size G (KIVI's or HQQ's quantization "
    "group), - for a cache without one; × dyn = cache bytes / dynamic's; ms/tok = one whole generate() call "
    "(prefill + decode) / new tokens, median of the timed calls; lat × = median of the per-round paired ratios to "
    "dynamic (so not ms/tok / ms/tok); NLL / Δ = mean NLL of the fixed continuation, nats/token (dynamic) or its "
    "change; top-k = top-k overlap with dynamic's logits; agree = share of greedy tokens equal to dynamic's (noisy: "
    "one flip changes the rest); recall / passkey = accuracy (recall's ✓ judges the drop at its worst distance, "
    "passkey's the overall drop); passkey - = no passkey grid at that context (it runs at --retrieval-contexts, by "
    "default the smallest context only); KL = mean KL(dynamic || cache), nats; peak MiB = peak of the tensor bytes "
    "one generate() call creates (cache, activations, logits; the weights not counted), - where not measured; "
    "✓/✗ = the gate of that column"
)

# the gates by their names in the reports; the result file keeps the field names (summary.decision_gates)
GATE_NAMES = {
    "nll_delta": "ΔNLL",
    "topk_overlap": "top-k overlap",
    "latency_ratio": "latency ratio",
    "saves_memory": "memory saved",
    "recall_drop": "recall drop",
    "passkey_drop": "passkey drop",
    "kl_mean": "KL mean",
}
# the kvlab eval flag that sets each gate's threshold (saves_memory has none: a cache saves bytes or it does not)
GATE_FLAGS = {
    "nll_delta": "--max-nll-delta",
    "topk_overlap": "--min-topk-overlap",
    "latency_ratio": "--max-latency-ratio",
    "recall_drop": "--max-recall-drop",
    "passkey_drop": "--max-passkey-drop",
    "kl_mean": "--max-kl-mean",
}


def gate_names(gates) -> list[str]:
    """The reports' names of gate fields (``["nll_delta", "kl_mean"]`` -> ``["ΔNLL", "KL mean"]``); a field this
    module does not know is shown as it is."""
    return [GATE_NAMES.get(str(g), str(g)) for g in gates or ()]


# the decision of kvlab.eval.decision.decide when no capacity row passed every gate
NO_CANDIDATE = "tune_cache_policy"


def no_candidate_advice(result: dict) -> str | None:
    """For the decision ``tune_cache_policy`` (:func:`kvlab.eval.decision.decide`: no candidate row of the capacity
    matrix passed every gate): what it means, the gates the rows failed on with their counts, and what to try;
    None for any other decision."""
    summary = result.get("summary") if isinstance(result, dict) else None
    if not isinstance(summary, dict) or summary.get("decision") != NO_CANDIDATE:
        return None
    rows = [
        r
        for r in result.get("rows") or []
        if r.get("matrix") == "capacity" and r.get("candidate") != "dynamic"
    ]
    if not rows:
        return (
            "no candidate cache was measured in the capacity matrix (see the failures), so kvlab recommends "
            "none: keep DynamicCache"
        )
    failed: dict[str, int] = {}
    for r in rows:
        for gate, passed in (r.get("gates") or {}).items():
            if passed is False:
                failed[gate] = failed.get(gate, 0) + 1
    order = sorted(failed, key=lambda g: -failed[g])
    counts = ", ".join(f"{GATE_NAMES.get(g, g)}: {failed[g]} of {len(rows)} rows" for g in order)
    tries = [
        "candidates that lose less (more bits, a larger --residual or a smaller --group-size / --hqq-group-size; "
        "for an evicting cache a larger token_budget or window_length, e.g. tova:token_budget=512)"
    ]
    if "saves_memory" in failed:
        tries.append(
            "longer --contexts (a cache with a residual window or a budget saves bytes only past it)"
        )
    flags = [GATE_FLAGS[g] for g in order if g in GATE_FLAGS]
    if flags:
        tries.append(f"a looser gate if your use tolerates the loss ({', '.join(flags)})")
    return (
        f"{NO_CANDIDATE} = no candidate passed every gate at any context of the capacity matrix, so kvlab "
        f"recommends none: keep DynamicCache (the rows failed on {counts or 'no gate; see the failures'}). To find "
        f"a cache that passes, rerun kvlab eval with {'; or '.join(tries)}."
    )


def print_summary(result: dict, console: Console | None = None) -> None:
    """Print provenance, gates, both matrices, failures and the decision."""
    if console is None:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:  # a pipe: rich's 80 columns cut tables
            console = Console(width=150)
    _print_header(result, console)
    for matrix in ("capacity", "window"):
        for table in matrix_tables(result, matrix, console.width):
            console.print(table)
    for table in passkey_tables(result, console.width):
        console.print(table)
    if any(r.get("matrix") in ("capacity", "window") for r in result.get("rows", [])):
        console.print(f"[dim]{COLUMN_LEGEND}[/]")
    for line in fp8_range_lines(result):
        console.print(line)
    for f in result["failures"]:
        where = [
            text
            for text, value in (
                (f"{f['candidate']}", f["candidate"]),
                (f"ctx {f.get('context_length')}", f.get("context_length")),
                (f"R {f.get('residual_length')}", f.get("residual_length")),
            )
            if value is not None
        ]  # a model that failed to load has no candidate, context or residual
        console.print(f"[red]failed[/] {' '.join(where + [''])}at {f['stage']}: {f['type']}: {f['message']}")
    if result.get("summary"):
        _print_decision(result, result["summary"], console)
        from kvlab.eval.margins import margin_warning

        close = margin_warning(result)
        if close:
            console.print(f"[yellow]warning:[/] {close}")
        note = bundled_model_note(result)
        if note:
            console.print(f"[yellow]note:[/] {note}")
    if result.get("elapsed_s") is not None:
        console.print(f"elapsed {result['elapsed_s']:.1f} s")


def _short_fingerprint(fingerprint: object) -> str:
    """``sha256:af191d224`` / ``gguf-sha256:b179c9523`` / ``hf:<id>@<commit>``: the kind and 9 hex digits."""
    text = str(fingerprint)
    kind, _, digest = text.rpartition(":")
    return f"{kind}:{digest[:9]}" if kind and "@" not in text else text[:60]


BUNDLED_ID = "kvlab-reference (bundled)"
REAL_MODEL_COMMAND = "kvlab eval --model smollm2-135m"


def bundled_model_note(result: dict) -> str | None:
    """For a run on the bundled model: that its decision is a test result, not advice for a served model (its
    verdicts differ from a real LLM's, docs/EVAL.md), and the command that runs a real one; else None."""
    model = result.get("provenance", {}).get("model", {})
    if model.get("id_or_path") != BUNDLED_ID:
        return None
    return (
        "this ran on the bundled 5 M-parameter test model, whose verdicts differ from a real LLM's (docs/EVAL.md); "
        f"for a decision about a served model run a real one: {REAL_MODEL_COMMAND} (offline, after "
        "`kvlab models get smollm2-135m`), or --model with your own"
    )


def _print_header(result: dict, console: Console) -> None:
    """Label, status, model, software, gates and skipped candidates."""
    prov = result.get("provenance", {})
    model = prov.get("model", {})
    sw = prov.get("software", {})
    hw = prov.get("hardware", {})
    console.print(f"[bold]kvlab eval[/] {result['label']} — status [bold]{result['status']}[/]")
    if model:
        console.print(
            f"model {model.get('id_or_path')} ({model.get('dtype')}, {model.get('device')}), "
            f"fingerprint {_short_fingerprint(model.get('fingerprint'))}"
        )
        source = model.get("source") or {}
        if source.get("package"):  # a GGUF shipped in a package: which one, and what its weights are
            console.print(
                f"  from {source['package']} {source.get('package_version')}: {source.get('weights')}, "
                f"GGUF sha256 {str(source.get('gguf_sha256'))[:16]}"
            )
        elif source.get("gguf_sha256"):
            console.print(f"  from {source.get('gguf_file')}: {source.get('weights')}")
    threads = f", {prov['torch_threads']} torch thread(s)" if prov.get("torch_threads") else ""
    console.print(
        f"torch {sw.get('torch')}, transformers {sw.get('transformers')}, "
        f"hqq {sw.get('hqq')}, device {hw.get('device')}{threads}"
    )
    g = result["gates"]
    console.print(
        f"gates: ΔNLL ≤ {g['max_nll_delta']}, top-k overlap ≥ {g['min_topk_overlap']}, "
        f"latency ratio ≤ {g['max_latency_ratio']}; memory = exact cache bytes vs DynamicCache"
    )
    if "max_kl_mean" in g:  # results written before the long-context gates have none
        console.print(
            f"long-context gates: recall drop ≤ {g['max_recall_drop']} (worst distance), passkey drop ≤ "
            f"{g['max_passkey_drop']} (mean over depths), KL mean ≤ {g['max_kl_mean']} nats; recall and passkey "
            f"columns: accuracy (the mark judges the drop vs dynamic)"
        )
    for c in result["candidates"]:
        if not c.get("available", True):
            console.print(f"[yellow]skipped[/] {c['name']}: {c['skip_reason']}")


def _print_decision(result: dict, s: dict, console: Console) -> None:
    """Onset, crossover, the selected row with its long-context figures, the decision and its warnings."""
    console.print(
        f"memory-reduction onset (first context saving bytes): {s['memory_reduction_onset_context']}; eligible "
        f"crossover (first context passing every gate): {s['eligible_crossover_context']}; eligible capacity rows: "
        f"{s['eligible_candidate_count']}"
    )
    sel = s.get("selected_candidate")
    if sel:
        console.print(
            f"selected: {sel['candidate']} at context {sel['context_length']} — cache "
            f"{_f(sel.get('cache_bytes_ratio'), '.3f')}× dynamic, ΔNLL {_f(sel.get('nll_delta'), '+.3f')}, "
            f"top-k {_f(sel.get('topk_overlap'), '.2f')}, latency {_f(sel.get('latency_ratio'), '.2f')}×"
        )
        row = next(
            (
                r
                for r in result["rows"]
                if r["matrix"] == "capacity"
                and r["candidate"] == sel["candidate"]
                and r["context_length"] == sel["context_length"]
            ),
            {},
        )
        extra = [
            f"{label} {row[key]:{fmt}}"
            for key, label, fmt in (
                ("recall_drop", "recall drop", "+.3f"),
                ("passkey_drop", "passkey drop", "+.2f"),
                ("kl_mean", "KL mean", ".4f"),
            )
            if row.get(key) is not None
        ]
        if extra:
            console.print("          " + ", ".join(extra))
    for f in s.get("failed_candidates") or []:  # requested, yet absent from the decision: say so next to it
        console.print(
            f"[red]not judged:[/] {f['candidate']} failed in every capacity cell (first at {f['stage']}: "
            f"{f['type']}: {f['message']}); the decision leaves it out"
        )
    judged = f" (judged on: {', '.join(gate_names(s['decision_gates']))})" if s.get("decision_gates") else ""
    console.print(f"[bold]decision: {s['decision']}[/]{judged}")
    advice = no_candidate_advice(result)
    if advice:
        console.print(f"  {advice}", markup=False)
    rule = decision_rule(s)
    if rule:
        console.print(f"  ({rule})")
    if s.get("latency_trusted") is False:
        console.print("[yellow]latency: not trusted (the machine was busy while timing; see the warning)[/]")
    if s.get("latency_warning"):
        console.print(f"[yellow]warning: {s['latency_warning']}[/]")
    if s.get("long_context_warning"):
        console.print(f"[yellow]warning: {s['long_context_warning']}[/]")
    if s.get("eviction_warning"):
        console.print(f"[yellow]warning: {s['eviction_warning']}[/]")
    if s.get("long_context_not_measured"):
        console.print(f"[yellow]warning: {s['long_context_not_measured']}[/]")
    if s.get("dtype_warning"):
        console.print(f"[yellow]warning: {s['dtype_warning']}[/]")
