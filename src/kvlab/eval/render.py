"""Human summary of an eval result (rich tables), built from the result dict alone."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvlab.eval.decision import UNSTABLE_TIMING_SPREAD, preference
from kvlab.eval.decision_words import (
    GREEDY_AGREEMENT_WHY,
    alternative_line,
    bundled_model_note,
    decision_rule,
    decision_text,
    first_context_text,
    fp8_range_lines,
    gate_names,
    no_candidate_advice,
    window_quality_note,
)
from kvlab.eval.records import STOP_TYPES
from kvlab.eval.resume import elapsed_words
from kvlab.eval.twins import integer_path_lines
from kvlab.runtime.console import stdout_console

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
        _f(r["ms_per_token"], ".1f") + (" [yellow]~[/]" if _noisy(r) else ""),
        "1" if base else _f(r.get("latency_ratio"), ".2f") + _mark(r, "latency_ratio"),
        _f(r.get("mean_nll"), ".3f") if base else _f(r.get("nll_delta"), "+.3f") + _mark(r, "nll_delta"),
        "" if base else _f(r.get("topk_overlap"), ".2f") + _mark(r, "topk_overlap"),
        "" if base else _f(r.get("token_agreement_rate"), ".2f") + _first_divergence(r),
        _f(r.get("recall_accuracy"), ".3f") + _mark(r, "recall_drop"),
        _f(r.get("passkey_accuracy"), ".2f") + _mark(r, "passkey_drop"),
        "" if base else _f(r.get("kl_mean"), ".4f") + _mark(r, "kl_mean"),
        _f(None if peak is None else peak / MIB, ".1f"),
        "baseline" if base else ("[green]eligible[/]" if r.get("eligible") else "[red]rejected[/]"),
    )


def _first_divergence(row: dict) -> str:
    """`` @n``: the first generated token (from 0) where the cache's greedy output differs from dynamic's; ``""``
    where none differs (or the row has no such field)."""
    first = row.get("first_divergence_index")
    return "" if isinstance(first, bool) or not isinstance(first, int) else f" @{first}"


def _noisy(row: dict) -> bool:
    """Whether the row's timed calls differ by more than :data:`~kvlab.eval.decision.UNSTABLE_TIMING_SPREAD`
    (the latency warning counts it: :func:`~kvlab.eval.decision.spread_warning`)."""
    return (row.get("timing_spread") or 0) > UNSTABLE_TIMING_SPREAD


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


def matrix_tables(result: dict, matrix: str, width: int | None) -> list[Table]:
    """A matrix's table, a row per cell with the baseline first at each context, split into parts that each fit
    ``width`` characters unwrapped (:func:`_fit`; ``None``: one part); ``[]`` when the matrix has no row."""
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


def passkey_tables(result: dict, width: int | None) -> list[Table]:
    """The passkey grid (:func:`_passkey_grid`) split into parts that each fit ``width`` characters unwrapped
    (:func:`_fit`; ``None``: one part); ``[]`` when no row has it."""
    grid = _passkey_grid(result)
    return [] if grid is None else _fit(grid, width)


# what each matrix column holds (printed once under the tables): a new user could not make ms/tok and lat × agree.
# Each part names the result field whose column it explains (None: a column every table has); column_legend keeps
# the parts of the columns shown (a --no-long-context run has no recall / passkey / KL column to explain)
COLUMN_LEGEND_PARTS = (
    (None, "columns: R/G = residual window R (newest tokens kept unquantized) / group size G (KIVI's or HQQ's "
     "quantization group), - for a cache without one; × dyn = cache bytes / dynamic's; ms/tok = one whole "
     "generate() call (prefill + decode) / new tokens, median of the timed calls; lat × = median of the per-round "
     "paired ratios to dynamic (so not ms/tok / ms/tok); NLL / Δ = mean NLL of the fixed continuation, nats/token "
     "(dynamic) or its change; top-k = top-k overlap with dynamic's logits; agree = share of the generated greedy "
     "tokens equal to dynamic's, @n = the first that differs (from 0); " + GREEDY_AGREEMENT_WHY),
    ("recall_accuracy", "recall = accuracy (its ✓ judges the drop at its worst distance)"),
    ("passkey_accuracy", "passkey = accuracy (its ✓ judges the overall drop); passkey - = no passkey grid at that "
     "context (it runs at --retrieval-contexts, by default the smallest context only)"),
    ("kl_mean", "KL = mean KL(dynamic || cache), nats"),
    (None, "peak MiB = peak of the tensor bytes one generate() call creates (cache, activations, logits; the "
     "weights not counted), - where not measured; "
     f"✓/✗ = the gate of that column; ~ after ms/tok = that cache's timed calls differed by more than "
     f"{UNSTABLE_TIMING_SPREAD}x (noisy, its lat × and ✓ too; see the warning)"),
)
COLUMN_LEGEND = "; ".join(text for _, text in COLUMN_LEGEND_PARTS)


def column_legend(result: dict) -> str:
    """The legend of the matrix columns ``result``'s tables show (:data:`COLUMN_LEGEND_PARTS`): a long-context
    column's part only where some capacity or window row has its field, as :func:`_matrix_grid` keeps the column."""
    rows = [r for r in result.get("rows", []) if r.get("matrix") in ("capacity", "window")]
    return "; ".join(
        text for key, text in COLUMN_LEGEND_PARTS if key is None or any(r.get(key) is not None for r in rows)
    )


def planned_line(result: dict) -> str | None:
    """For a result with no measured row yet (a ``--dry-run`` or a run that stopped before its first cell): how many
    cells its plan holds per matrix and that nothing was measured; None when a row exists."""
    if result.get("rows"):
        return None
    plan = [c for c in result.get("plan") or [] if isinstance(c, dict)]
    counts = {m: sum(c.get("matrix") == m for c in plan) for m in ("capacity", "window")}
    parts = ", ".join(f"{n:,} {m}" for m, n in counts.items() if n)
    again = "; run the same command without --dry-run to measure them" if result.get("status") == "dry_run" else ""
    return f"{len(plan):,} cells planned{f' ({parts})' if parts else ''}, nothing measured{again}"


def timing_line(result: dict) -> str | None:
    """How quiet the machine was while the cells were timed, from the rows' ``timing_contention``
    (:func:`kvlab.runtime.timing.contention`): the smallest CPU share this process got and the most cores other
    processes used, beside the limits past which a cell's latency is not trusted; None when no row records it."""
    from kvlab.runtime.timing import BUSY_OTHER_CORES, MIN_CPU_SHARE

    cont = [r["timing_contention"] for r in result.get("rows", []) if isinstance(r.get("timing_contention"), dict)]
    shares = [c["cpu_share"] for c in cont if isinstance(c.get("cpu_share"), (int, float))]
    others = [
        (c["other_cores"] + (c.get("steal_cores") or 0.0), c)
        for c in cont
        if isinstance(c.get("other_cores"), (int, float)) and isinstance(c.get("cpus"), int)
    ]
    parts = []
    if shares:
        parts.append(f"this process got {min(shares):.0%} or more of its threads' CPU time (busy below {MIN_CPU_SHARE:.0%})")
    if others:
        most, c = max(others, key=lambda x: x[0])
        limit = max(0, c["cpus"] - c.get("threads", 1)) + BUSY_OTHER_CORES
        parts.append(f"other processes used at most {most:.2f} of {c['cpus']} cores (busy above {limit:g})")
    if not parts:
        return None
    busy = sum(bool(c.get("busy")) for c in cont)
    return f"timing: {'; '.join(parts)}; {busy} of {len(cont)} timed cells busy"


def print_summary(result: dict, console: Console | None = None) -> None:
    """Print provenance, gates, both matrices, failures and the decision."""
    if console is None:
        console = stdout_console()  # a pipe: rich's 80 columns cut tables
    _print_header(result, console)
    line = planned_line(result)
    if line:
        console.print(line)
    for matrix in ("capacity", "window"):
        for table in matrix_tables(result, matrix, console.width):
            console.print(table)
    note = window_quality_note(result)  # under the window table: HQQ's quality cannot move with R
    if note:
        console.print(f"[dim]note: {note}[/]", markup=True)
    for table in passkey_tables(result, console.width):
        console.print(table)
    if any(r.get("matrix") in ("capacity", "window") for r in result.get("rows", [])):
        console.print(f"[dim]{column_legend(result)}[/]")
    line = timing_line(result)
    if line:
        console.print(f"[dim]{line}[/]")
    for line in fp8_range_lines(result) + integer_path_lines(result):
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
        # the run's own entry of an interrupt (kvlab.eval.records.stop_run): stopped, not failed
        stopped = f.get("candidate") is None and f.get("type") in STOP_TYPES
        word = "[yellow]stopped[/]" if stopped else "[red]failed[/]"
        console.print(f"{word} {' '.join(where + [''])}at {f['stage']}: {f['type']}: {f['message']}")
    if result.get("summary"):
        _print_decision(result, result["summary"], console)
        from kvlab.eval.margins import margin_warning

        close = margin_warning(result)
        if close:
            console.print(f"[yellow]warning:[/] {close}")
        note = bundled_model_note(result)
        if note:
            console.print(f"[yellow]note:[/] {note}")
    elapsed = elapsed_words(result)
    if elapsed:
        console.print(elapsed)


def _short_fingerprint(fingerprint: object) -> str:
    """``sha256:af191d224`` / ``gguf-sha256:b179c9523`` / ``hf:<id>@<commit>``: the kind and 9 hex digits."""
    text = str(fingerprint)
    kind, _, digest = text.rpartition(":")
    return f"{kind}:{digest[:9]}" if kind and "@" not in text else text[:60]


def _device_words(result: dict, hw: dict) -> str:
    """``device cpu`` as the result records it; a dry run loads no model, so it records none: say so."""
    if hw.get("device") is not None:
        return f"device {hw['device']}"
    asked = (result.get("settings") or {}).get("device")
    asked = f"; --device {asked}" if asked else ""
    if result.get("status") in ("dry_run", "planned"):
        return f"device not loaded ({result['status'].replace('_', ' ')}{asked})"
    return f"device not recorded in the result{asked}"


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
    versions = ", ".join(  # a package the run did not have: said, not Python's None
        f"{name} {sw.get(name) or 'not installed'}" for name in ("torch", "transformers", "hqq")
    )
    console.print(f"{versions}, {_device_words(result, hw)}{threads}")
    g = result["gates"]
    rule = (  # the default rule (most bytes saved) is told beside the decision; the other one here too
        "; selection (--prefer latency): the lowest latency ratio of the eligible rows at the context of the one "
        "saving the most cache bytes"
        if preference(result) == "latency"
        else ""
    )
    console.print(
        f"gates: ΔNLL ≤ {g['max_nll_delta']}, top-k overlap ≥ {g['min_topk_overlap']}, "
        f"latency ratio ≤ {g['max_latency_ratio']}; memory = exact cache bytes vs DynamicCache{rule}"
    )
    if "max_kl_mean" in g and (result.get("settings") or {}).get("long_context") is False:
        console.print(  # --no-long-context: no recall or passkey column to judge, only the KL
            f"long-context gates: KL mean ≤ {g['max_kl_mean']} nats; recall and passkey not measured "
            "(--no-long-context)"
        )
    elif "max_kl_mean" in g:  # results written before the long-context gates have none
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
    onset = first_context_text(s.get("memory_reduction_onset_context"), "none (no context saved bytes)")
    crossover = first_context_text(s.get("eligible_crossover_context"), "none (no context passed every gate)")
    console.print(
        f"memory-reduction onset (first context saving bytes): {onset}; eligible crossover (first context passing "
        f"every gate): {crossover}; eligible capacity rows: {s['eligible_candidate_count']}"
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
    caveat = (
        " [yellow]-- caveat: judged at contexts past the model's trained positions (see the warning)[/]"
        if s.get("positions_warning")
        else ""
    )
    console.print(f"[bold]decision: {decision_text(s)}[/]{judged}{caveat}")
    if "--quick" in (result.get("command") or []):  # a smoke run's verdict is not one to act on
        console.print("  (a --quick smoke run: short contexts, few tokens and trials; decide with the default matrix)")
    advice = no_candidate_advice(result)
    if advice:
        console.print(f"  {advice}", markup=False)
    rule = decision_rule(s, preference(result))
    if rule:
        console.print(f"  ({rule})")
    other = alternative_line(result)  # the eligible row the other --prefer would weigh
    if other:
        console.print(f"  {other}", markup=False)
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
    if s.get("positions_warning"):
        console.print(f"[yellow]warning: {s['positions_warning']}[/]")
