"""``kvlab figures --result R`` on a result with only the baseline row printed matplotlib's "UserWarning: No artists
with labels found to put in legend" (a panel with nothing labelled on it): other libraries' warnings are hidden
unless --verbose (README), and this one named kvlab's own line, so the module filter missed it."""

from __future__ import annotations

import json
import warnings

from kvlab.cli import main
from kvlab.eval.decision import summarize
from kvlab.figures.results import plot_eval_matrix

from .conftest import synthetic_eval_result


def _baseline_only() -> dict:
    result = synthetic_eval_result("baseline-only")
    result["rows"] = [r for r in result["rows"] if r["candidate"] == "dynamic"]
    result["plan"] = [p for p in result["plan"] if p["candidate"] == "dynamic"]
    result["failures"] = []
    result["summary"] = summarize(result)
    return result


def test_a_panel_without_labelled_artists_draws_no_legend_and_warns_nothing(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = plot_eval_matrix(_baseline_only(), "capacity", "context_length", "ctx", tmp_path / "c.png")
    assert path is not None and path.is_file()  # the baseline's panels are still drawn
    assert [str(w.message) for w in caught if "legend" in str(w.message)] == []


def test_kvlab_figures_prints_no_matplotlib_warning_for_a_baseline_only_result(tmp_path, capsys):
    result_file = tmp_path / "r.json"
    result_file.write_text(json.dumps(_baseline_only()))
    out = tmp_path / "figs"
    argv = ["figures", "--result", str(result_file), "--out", str(out), "--no-probe", "--no-append"]
    with warnings.catch_warnings(record=True) as caught:  # what would reach a user's stderr (pytest records it)
        warnings.simplefilter("always")
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    assert [str(w.message) for w in caught] == [] and "No artists with labels" not in err
    assert (out / "eval_capacity.png").is_file()
