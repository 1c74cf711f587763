"""The sensitivity figure (``kvlab figures --sweep FILE --plan FILE``): drawn from a small sweep file built by code,
the fragile layer ranked first, the plan's formats drawn per layer; bad files refused in one line."""

from __future__ import annotations

import json

import pytest

import kvlab.figures
from kvlab.cli import main
from kvlab.sensitivity_figure import plot_sensitivity, sensitivity_figure_data

PNG = b"\x89PNG\r\n\x1a\n"
LAYERS, FRAGILE = 6, 2


def _sweep() -> dict:
    """A sweep of 6 layers in two formats: layer 2's keys 40x the others at 2 bits, values flat, one KL of 0."""
    kl = {}
    for fmt, base in (("kivi-2", 2e-3), ("fp8-e4m3", 1e-3)):
        keys = [base * (1 + 0.1 * i) for i in range(LAYERS)]
        keys[FRAGILE] *= 40
        kl[fmt] = {"k": keys, "v": [base] * (LAYERS - 1) + [0.0]}
    return {"kind": "kvlab-sensitivity", "model": "tiny", "layers": LAYERS, "formats": list(kl), "kl": kl,
            "cost": {"prompts": 2, "seconds": 1.5}}  # fmt: skip


PLAN = {"kvlab_plan": 1, "layers": {str(FRAGILE): {"k": "kivi-8", "v": "kivi-2"}, "*": {"k": "fp8-e4m3", "v": "fp8-e4m3"}}}  # fmt: skip


def test_the_figure_renders_from_a_small_sweep_and_a_plan(tmp_path):
    data = sensitivity_figure_data(_sweep(), PLAN)
    assert data["ranked"] == {"kivi-2": (FRAGILE, "k"), "fp8-e4m3": (FRAGILE, "k")}
    assert data["assignment"][FRAGILE] == ("kivi-8", "kivi-2") and data["assignment"][0] == ("fp8-e4m3",) * 2
    with_plan = plot_sensitivity(data, tmp_path / "p.png")
    without = plot_sensitivity(sensitivity_figure_data(_sweep()), tmp_path / "s.png")
    assert with_plan.read_bytes().startswith(PNG) and without.read_bytes().startswith(PNG)
    assert with_plan.stat().st_size != without.stat().st_size  # the strip is drawn


def test_kvlab_figures_draws_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kvlab.figures, "write_figures", lambda out, **kw: {})
    (tmp_path / "sweep.json").write_text(json.dumps(_sweep()))
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    out = tmp_path / "f"
    argv = [
        "figures",
        "--out",
        str(out),
        "--sweep",
        str(tmp_path / "sweep.json"),
        "--plan",
        str(tmp_path / "plan.json"),
    ]
    assert main([*argv, "--no-probe", "--no-append", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sensitivity"] == str(out / "sensitivity.png")
    assert (out / "sensitivity.png").read_bytes().startswith(PNG)
    assert main([*argv, "--no-probe", "--no-append"]) == 2  # kept without --force
    assert "sensitivity.png already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s, p: s.update(kind="kvlab-tasks"), "'kvlab-tasks'"),
        (lambda s, p: s["kl"]["kivi-2"]["k"].pop(), "kl['kivi-2']['k']"),
        (lambda s, p: s["kl"]["kivi-2"]["v"].__setitem__(0, -1.0), "-1.0"),
        (lambda s, p: p["layers"].update({"9": {"k": "float", "v": "float"}}), "layer 9"),
        (lambda s, p: s["formats"].append(["kivi-2"]), "`formats` must list format names, got ['kivi-2']"),
        (lambda s, p: s.update(cost="x"), "`cost` must be an object, got 'x'"),
    ],
)
def test_bad_sweeps_and_plans_are_refused_in_one_line(tmp_path, capsys, change, named):
    sweep, plan = _sweep(), json.loads(json.dumps(PLAN))
    change(sweep, plan)
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    argv = ["figures", "--out", str(tmp_path / "f"), "--sweep", str(tmp_path / "sweep.json")]
    assert main([*argv, "--plan", str(tmp_path / "plan.json"), "--no-probe", "--no-append"]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "--sweep" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "f" / "sensitivity.png").exists()


def test_a_plan_needs_a_sweep(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path / "f"), "--plan", "p.json"]) == 2
    assert "pass --sweep FILE too" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["--sweep", "--plan"])
def test_a_sweep_or_plan_that_is_not_text_is_named_with_its_file(tmp_path, capsys, which):
    """``--sweep`` of a binary file printed only "'utf-8' codec can't decode byte 0xff ...", naming no file."""
    (tmp_path / "sweep.json").write_text(json.dumps(_sweep()))
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{\x00}\x00")
    files = {"--sweep": str(tmp_path / "sweep.json"), "--plan": str(tmp_path / "plan.json")}
    files[which] = str(tmp_path / "binary.json")
    argv = ["figures", "--out", str(tmp_path / "f"), "--no-probe", "--no-append"]
    assert main([*argv, "--sweep", files["--sweep"], "--plan", files["--plan"]]) == 2
    err = capsys.readouterr().err
    named = f"--sweep {files['--sweep']}: not JSON" if which == "--sweep" else f"plan file '{files['--plan']}' is not JSON"
    assert named in err and len(err.splitlines()) == 1, err
