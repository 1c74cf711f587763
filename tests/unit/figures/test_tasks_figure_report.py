"""A ``kvlab tasks`` result in ``kvlab figures`` (the score-vs-bytes-ratio figure) and in ``kvlab report`` (text,
and HTML alone or as a section of an eval result's page), from a small result built by code."""

from __future__ import annotations

import base64
import json
import re

import pytest

import kvlab.figures
from kvlab.cli import main
from kvlab.eval.tasks_render import table_rows
from kvlab.report_tasks import render_report
from kvlab.task_figures import plot_task_scores

PNG = b"\x89PNG\r\n\x1a\n"


def _write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_figure_is_a_png(tasks_result, tmp_path):
    path = plot_task_scores(tasks_result, tmp_path / "t.png")
    assert path.read_bytes().startswith(PNG)


def test_kvlab_figures_draws_a_tasks_result(tasks_result, eval_result, tmp_path, monkeypatch, capsys):
    drawn = []
    monkeypatch.setattr(kvlab.figures, "write_figures", lambda out, **kw: drawn.append(kw["result"]) or {})
    tasks, evals, out = (
        _write(tmp_path, "t.json", tasks_result),
        _write(tmp_path, "e.json", eval_result),
        tmp_path / "f",
    )
    assert (
        main(["figures", "--out", str(out), "--result", str(tasks), "--no-probe", "--no-append", "--json"])
        == 0
    )
    assert drawn == [None]  # no eval result: write_figures draws no eval figure
    assert json.loads(capsys.readouterr().out)["tasks_scores"] == str(out / "tasks_scores.png")
    assert (out / "tasks_scores.png").read_bytes().startswith(PNG)
    argv = [
        "figures",
        "--out",
        str(out),
        "--result",
        str(evals),
        "--result",
        str(tasks),
        "--no-probe",
        "--no-append",
    ]
    assert main(argv) == 2  # the tasks figure exists: kept without --force
    assert "tasks_scores.png already exists" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert drawn[-1]["label"] == eval_result["label"]


def test_kvlab_figures_refuses_a_damaged_tasks_result(tasks_result, tmp_path, capsys):
    tasks_result["gates"][0]["status"] = "maybe"
    path = _write(tmp_path, "t.json", tasks_result)
    assert (
        main(["figures", "--out", str(tmp_path / "f"), "--result", str(path), "--no-probe", "--no-append"])
        == 2
    )
    assert "gates[0].status" in capsys.readouterr().err


def _table_cells(page: str) -> list[list[str]]:
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page)]


def _embedded_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(d) for d in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_html_of_a_tasks_result(tasks_result, tmp_path, capsys):
    path, html_out = _write(tmp_path, "t.json", tasks_result), tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(html_out)]) == 0
    page = html_out.read_text()
    rows = _table_cells(page)
    for row in table_rows(tasks_result):  # every (task, cache) row of the table, as the text report has it
        assert list(row) in rows
    assert ["kivi-2", "rejected", "niah_single_1@512"] in rows
    assert re.search(r'class="[^"]*\bfail">fail</td>', page)
    assert re.search(r'class="[^"]*\buntrusted">not informative</td>', page)
    pngs = _embedded_pngs(page)
    assert len(pngs) == 1 and pngs[0].startswith(PNG)
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "kivi-2: rejected (failed: niah_single_1@512)" in text and "not measured: cwe @ 512" in text
    # the legend of the columns, under the text table and in the HTML section
    for legend in (" ".join(text.split()), " ".join(page.split())):
        legend = legend.replace("&#x27;", "'")
        assert "columns: × dyn = cache bytes / dynamic's (the float cache's) after the context is filled" in legend
        assert "(as kvlab eval's × dyn column)" in legend and "with its Wilson 95 % interval" in legend


def test_report_html_of_an_eval_and_a_tasks_result(eval_result, tasks_result, tmp_path):
    evals, tasks = _write(tmp_path, "e.json", eval_result), _write(tmp_path, "t.json", tasks_result)
    html_out = tmp_path / "r.html"
    assert main(["report", str(evals), str(tasks), "--html", str(html_out)]) == 0
    page = html_out.read_text()
    alone = render_report(eval_result)
    assert "<h2>Long-context tasks (kvlab tasks)</h2>" in page and "Long-context tasks" not in alone
    assert len(_embedded_pngs(page)) == len(_embedded_pngs(alone)) + 1
    assert page.index("Long-context tasks") < page.index("<h2>Provenance</h2>")
    assert main(["report", str(evals), str(tasks), "--html", str(html_out)]) == 2  # kept without --force


def test_report_refuses_two_of_a_kind_and_nothing(tasks_result, tmp_path, capsys):
    tasks = _write(tmp_path, "t.json", tasks_result)
    other = _write(tmp_path, "u.json", tasks_result)
    assert main(["report", str(tasks), str(other)]) == 2
    err = capsys.readouterr().err
    # was: "kvlab report: error: kvlab report: ..." (the command's name given as the flag)
    assert err == f"kvlab report: error: {tasks} and {other} are both kvlab tasks results; give one of each kind\n"
    assert main(["report", str(tasks), str(tasks)]) == 2
    assert f"error: {tasks} is given twice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="give an eval result"):
        render_report()


def test_a_result_without_cells_skips_its_figure_only(
    tasks_result, eval_result, tmp_path, monkeypatch, capsys
):
    # what Ctrl-C in the first cell, or a run whose every task is too long, leaves
    failure = {
        "candidate": None,
        "stage": "run",
        "type": "KeyboardInterrupt",
        "message": "interrupted by the user",
    }
    empty = dict(tasks_result, cells=[], status="failed", gates=[], decision={}, failures=[failure])
    tasks = _write(tmp_path, "t.json", empty)
    evals = _write(tmp_path, "e.json", eval_result)
    page = render_report(None, empty)
    assert "No score-vs-bytes figure" in page and "<img" not in page
    assert main(["report", str(tasks), "--html", str(tmp_path / "t.html")]) == 0
    assert "tasks figure skipped" in capsys.readouterr().err and (tmp_path / "t.html").exists()
    assert main(["report", str(evals), str(tasks), "--html", str(tmp_path / "b.html")]) == 0
    assert "No score-vs-bytes figure" in (tmp_path / "b.html").read_text()
    drawn = []
    monkeypatch.setattr(kvlab.figures, "write_figures", lambda out, **kw: drawn.append(kw["result"]) or {})
    out = tmp_path / "f"
    assert main(["figures", "--out", str(out), "--result", str(tasks), "--no-probe", "--no-append"]) == 0
    err = capsys.readouterr().err
    assert "tasks_scores.png skipped: the tasks result (status failed) has no measured cell" in err
    assert drawn == [None] and not (out / "tasks_scores.png").exists()
