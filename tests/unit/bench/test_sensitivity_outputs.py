"""Where ``kvlab sensitivity`` writes: a folder that cannot take the file is refused before any work (exit 2,
the flag named), not after the sweep as a traceback."""

from __future__ import annotations

from pathlib import Path

from kvlab.cli import main

SWEEP = Path(__file__).resolve().parents[3] / "docs" / "examples" / "mixed" / "sensitivity-smollm2-1024.json"


def test_sweep_refuses_a_missing_out_folder_before_loading_the_model(tmp_path, capsys, monkeypatch):
    # it ran the whole sweep, then ended in FileNotFoundError (exit 1) and the result was lost
    import kvlab.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(kvlab.models, "load_model", never)
    out = tmp_path / "nonexistent" / "x.json"
    argv = [
        "sensitivity",
        "sweep",
        "--out",
        str(out),
        "--context",
        "256",
        "--prompts",
        "1",
        "--formats",
        "kivi-4",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--out {out}: folder {out.parent} does not exist" in err, err
