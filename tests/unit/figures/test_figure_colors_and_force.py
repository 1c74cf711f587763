"""One colour per candidate across an eval result's figures, and ``kvlab figures`` keeping existing files."""

from __future__ import annotations

import contextlib
import io

import pytest

from kvlab import figures
from kvlab.cli import main
from kvlab.commands import EXIT_FILE_EXISTS


def _line_colors(monkeypatch, draw) -> dict[str, str]:
    """Draw with ``save_png`` captured; return ``{legend label: line colour}`` of every axis of the figure."""
    from matplotlib.colors import to_hex

    captured = []
    # the eval figures draw in kvlab.figures.results: capture its save_png
    monkeypatch.setattr(figures.results, "save_png", lambda fig, path: captured.append(fig) or path)
    draw()
    (fig,) = captured
    colors: dict[str, str] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label()
            if not label.startswith("_") and not label.startswith("gate"):
                assert colors.setdefault(label, to_hex(line.get_color())) == to_hex(line.get_color())
    return colors


def test_a_candidate_has_one_colour_in_both_matrices(eval_result, monkeypatch, tmp_path):
    capacity = _line_colors(
        monkeypatch,
        lambda: figures.plot_eval_matrix(eval_result, "capacity", "context_length", "T", tmp_path / "c.png"),
    )
    window = _line_colors(
        monkeypatch,
        lambda: figures.plot_eval_matrix(eval_result, "window", "residual_length", "R", tmp_path / "w.png"),
    )
    shared = set(capacity) & set(window)
    assert shared and set(capacity) - set(window)  # the window matrix leaves candidates out
    for name in shared:
        assert capacity[name] == window[name], name
    assert len(set(capacity.values())) == len(capacity)  # and different candidates differ
    assert capacity == {n: figures.result_colors(eval_result)[n] for n in capacity}


def test_colour_map_is_keyed_by_name_not_position():
    a = figures.candidate_colors(["kivi-2", "dynamic", "hqq-4"])
    b = figures.candidate_colors(["hqq-4", "kivi-2", "dynamic", "hqq-4"])
    assert a == b and a["dynamic"] == figures.C_MAIN


def test_figures_refuses_to_overwrite_without_force(tmp_path):
    kept = tmp_path / "fig_memory_ledger.png"
    kept.write_bytes(b"kept")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["figures", "--out", str(tmp_path), "--no-probe", "--no-append"])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == EXIT_FILE_EXISTS
    assert len(lines) == 1 and lines[0].startswith("kvlab figures: error: ")
    assert "fig_memory_ledger.png already exists" in lines[0] and "--force" in lines[0]
    assert kept.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig_memory_ledger.png"]  # nothing else written


@pytest.mark.parametrize("with_result", [False, True])
def test_figure_files_lists_what_write_figures_writes(eval_result, tmp_path, with_result):
    result = eval_result if with_result else None
    steps = []
    paths = figures.write_figures(
        tmp_path, result=result, run_probe=False, append=False, progress=steps.append
    )
    listed = set(figures.figure_files(result=result, append=False))
    assert {p.name for p in paths.values()} <= listed
    assert {p.name for p in tmp_path.iterdir()} <= listed
    assert len(steps) == figures.figure_steps(result=result, append=False)
