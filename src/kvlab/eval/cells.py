"""Which cells a ``kvlab eval`` run measures, in which order, and which caches each one holds.

A *cell* is one matrix at one context: the float baseline and every runnable candidate on the same prompt. The
capacity matrix has one cell per context at one residual window R; the residual-window matrix has one cell at its
context whose caches run at every R. :func:`cell_caches` is the one place that says which caches a cell runs (a
cache without a residual window runs once: the window matrix varies only R); the plan, the progress steps, the
measurement and the probe jobs all ask it. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.eval.candidates import Candidate
from kvlab.eval.config import EvalConfig

MATRICES = ("capacity", "window")


@dataclass(frozen=True)
class Cell:
    """One matrix at one context."""

    matrix: str  # capacity | window
    context: int  # prompt tokens
    new_tokens: int  # tokens generated per call
    residuals: tuple[int, ...]  # the residual windows R its caches run at (capacity: one)
    group: int  # KIVI group size G of the cell

    @property
    def key(self) -> tuple[str, int]:
        """``(matrix, context)``: what names the cell in ``result["cells_done"]``."""
        return (self.matrix, self.context)


def run_cells(cfg: EvalConfig) -> list[Cell]:
    """Every cell of the run, in run order: the capacity contexts, then the residual-window cell (when
    ``cfg.window_residuals`` is not empty)."""
    cells = [
        Cell("capacity", c, cfg.new_tokens, (cfg.residual_length,), cfg.group_size) for c in cfg.contexts
    ]
    if cfg.window_residuals:
        residuals = tuple(cfg.window_residuals)
        cells.append(
            Cell("window", cfg.window_context, cfg.window_new_tokens, residuals, cfg.window_group_size)
        )
    return cells


def cell_caches(candidates: list[Candidate], cell: Cell) -> list[tuple[Candidate, int]]:
    """``(candidate, residual)`` of every cache ``cell`` runs besides its baseline, in run order (residual-major):
    a cache without a residual window (:attr:`Candidate.uses_residual` false) runs once, at the first R."""
    first = cell.residuals[0]
    return [(c, r) for r in cell.residuals for c in candidates if c.uses_residual or r == first]


def runnable(cfg: EvalConfig) -> list[Candidate]:
    """The candidates the run measures against the baseline: every one but ``dynamic`` whose back-end is here."""
    cands = [Candidate.parse(n) for n in cfg.candidates]
    return [c for c in cands if c.name != "dynamic" and c.unavailable_reason() is None]


def _plan_entry(cell: Cell, name: str, residual: int | None, group: int | None) -> dict:
    return {
        "matrix": cell.matrix,
        "candidate": name,
        "context_length": cell.context,
        "new_tokens": cell.new_tokens,
        "residual_length": residual,
        "group_size": group,
    }


def plan_cells(cfg: EvalConfig) -> list[dict]:
    """The result's ``plan``: ``{matrix, candidate, context_length, new_tokens, residual_length, group_size}`` of
    every cache of every cell, requested candidates whose back-end is missing included. A capacity cell lists every
    candidate as named (the baseline where the list has it) at the cell's R and G; the window cell lists the
    baseline first (no R, no G), then :func:`cell_caches`."""
    cands = [Candidate.parse(n) for n in cfg.candidates]
    others = [c for c in cands if c.name != "dynamic"]
    plan = []
    for cell in run_cells(cfg):
        if cell.matrix == "capacity":
            plan += [_plan_entry(cell, c.name, cell.residuals[0], cell.group) for c in cands]
            continue
        plan.append(_plan_entry(cell, "dynamic", None, None))
        for c, r in cell_caches(others, cell):
            plan.append(_plan_entry(cell, c.name, r if c.uses_residual else None, cell.group))
    return plan


def cell_keys(cfg: EvalConfig) -> list[tuple[str, int]]:
    """``(matrix, context)`` of every cell, in run order."""
    return [cell.key for cell in run_cells(cfg)]


def kept_cells(result: dict) -> frozenset[tuple[str, int]]:
    """The cells ``result["cells_done"]`` lists as finished, ``(matrix, context)``: a run keeps their rows and
    failures and measures them no more (empty for a new result; an older result without the list)."""
    return frozenset((c["matrix"], c["context_length"]) for c in result.get("cells_done") or ())


def probe_kinds(cfg: EvalConfig, cell: Cell) -> list[str]:
    """The long-context probes of one cell: recall always, passkey in the capacity matrix at the passkey
    contexts (:meth:`kvlab.eval.config.EvalConfig.passkey_contexts`); none with ``long_context`` off."""
    if not cfg.long_context:
        return []
    passkey = cell.matrix == "capacity" and cell.context in cfg.passkey_contexts()
    return ["recall"] + (["passkey"] if passkey else [])


def count_steps(cfg: EvalConfig) -> int:
    """Progress steps of a run: per cell, the baseline, each of its :func:`cell_caches`, the timing, and one per
    cache (baseline included) and long-context probe (a probe shared by both matrices is counted in each)."""
    cands = runnable(cfg)
    steps = 0
    for cell in run_cells(cfg):
        caches = len(cell_caches(cands, cell))
        steps += 2 + caches + len(probe_kinds(cfg, cell)) * (1 + caches)
    return steps


__all__ = [
    "Cell",
    "cell_caches",
    "cell_keys",
    "count_steps",
    "kept_cells",
    "plan_cells",
    "probe_kinds",
    "run_cells",
    "runnable",
]
