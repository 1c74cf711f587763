"""KIVI variants are eval candidates (``kvlab eval --help`` listed ``kivi-4-fused`` and ``--candidates
dynamic,kivi-4-fused`` was refused), and ``kivi-k8v4`` runs the dequantize path by itself in a fused run instead of
refusing the whole run."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.eval.candidates import Candidate, check_candidate_names


def err_of(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


def dry(tmp_path, label: str, candidates: str) -> int:
    return main(
        [
            "eval",
            "--dry-run",
            "--quick",
            "--out-dir",
            str(tmp_path),
            "--label",
            label,
            "--candidates",
            candidates,
        ]
    )


def test_kivi_variants_are_eval_candidates(tmp_path, capsys):
    """`kvlab eval --help` listed kivi-4-fused among every name; --candidates dynamic,kivi-4-fused was refused."""
    assert dry(tmp_path, "v", "dynamic,kivi-4-fused,kivi-4-dequant") == 0
    described = {
        c["name"]: c["attention"] for c in json.loads((tmp_path / "v.json").read_text())["candidates"][1:]
    }
    assert described == {"kivi-4-fused": "fused", "kivi-4-dequant": "dequantize"}
    assert (
        Candidate.parse("kivi-4-fused").make(None, 32, 32, kivi_attention="dequantize").attention == "fused"
    )
    check_candidate_names(("dynamic", "kivi-4", "kivi-4-fused"), "dequantize")  # two attention paths
    with pytest.raises(ValueError, match="'kivi-4' and 'kivi-4-fused' are the same cache"):
        check_candidate_names(("dynamic", "kivi-4", "kivi-4-fused"), "fused")


def test_split_width_kivi_runs_dequantized_in_a_fused_run(tmp_path, capsys):
    """kivi-k8v4 stopped the whole run ('use --kivi-attention dequantize'); now it runs the dequantize path alone."""
    assert dry(tmp_path, "k", "dynamic,kivi-4,kivi-k8v4") == 0
    assert "note: kivi-k8v4 run(s) the dequantize attention path" in err_of(capsys)
    described = {
        c["name"]: c["attention"] for c in json.loads((tmp_path / "k.json").read_text())["candidates"][1:]
    }
    assert described == {"kivi-4": "fused", "kivi-k8v4": "dequantize"}
    assert Candidate.parse("kivi-k8v4").make(None, 32, 32, kivi_attention="fused").attention == "dequantize"
    assert not Candidate.parse("kivi-k8v4").uses_kvlab_attention("fused")
    assert dry(tmp_path, "k2", "dynamic,kivi-k8v4-fused") == 2
    err = err_of(capsys)
    assert "'kivi-k8v4-fused'" in err and "use kivi-k8v4 (it runs the dequantize path)" in err, err
