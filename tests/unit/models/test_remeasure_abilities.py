"""scripts/train_reference.py --remeasure-abilities: a packaged model's card measured again, its weights untouched,
the replaced figures kept, the package rewritten whole."""

import hashlib
import json
import shutil

import pytest

from kvlab import models
from tests.conftest import make_tiny_qwen2

REFERENCE = models.reference_model_path()


@pytest.fixture
def package(tmp_path):
    """A package folder: a tiny model's weights, the reference tokenizer, held-out text, and the shipped
    provenance with its weights digest pointed at the tiny weights."""
    out = tmp_path / "model"
    make_tiny_qwen2(head_dim=32, max_positions=64, layers=2).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "heldout.txt", "provenance.json"):
        shutil.copy(REFERENCE / name, out / name)
    prov = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    prov["package"]["weights_sha256"] = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    (out / "provenance.json").write_text(json.dumps(prov), encoding="utf-8")
    return out


def fake_copy(calls):
    def measure(model, tokenizer, heldout_text, passkey_trials=20, copy_rows=24, parts=("copy", "passkey")):
        calls.append({"parts": parts, "copy_rows": copy_rows, "text": heldout_text[:20]})
        return {
            "method": "fake",
            "cache": "DynamicCache",
            "dtype": "bfloat16",
            "protected_tail": 160,
            "copy_span_tokens": 32,
            "passkey_trials": passkey_trials,
            "copy_rows": copy_rows,
            "copy": [
                {
                    "context": 512,
                    "distance": 192,
                    "accuracy": 0.5,
                    "nll": 1.0,
                    "trials": copy_rows,
                    "scored_tokens": 31 * copy_rows,
                }
            ],
            "passkey": [],
        }

    return measure


def test_copy_is_replaced_passkey_kept_history_and_card_written(tr, package, monkeypatch):
    before = json.loads((package / "provenance.json").read_text(encoding="utf-8"))
    weights = (package / "model.safetensors").read_bytes()
    calls = []
    monkeypatch.setattr(tr.abilities, "measure_abilities", fake_copy(calls))
    assert (
        tr.main(
            ["--remeasure-abilities", str(package), "--remeasure-parts", "copy", "--ability-copy-rows", "5"]
        )
        == 0
    )
    assert calls == [
        {"parts": ("copy",), "copy_rows": 5, "text": (REFERENCE / "heldout.txt").read_text()[:20]}
    ]
    after = json.loads((package / "provenance.json").read_text(encoding="utf-8"))
    ab, old = after["evaluation"]["abilities"], before["evaluation"]["abilities"]
    assert ab["copy"][0]["trials"] == 5 and ab["copy_rows"] == 5
    assert ab["passkey"] == old["passkey"] and ab["passkey_trials"] == old["passkey_trials"]
    assert ab["remeasured"]["parts"] == ["copy"] and "--remeasure-abilities" in ab["remeasured"]["command"]
    *kept, history = after["evaluation"]["abilities_history"]  # one entry more, the replaced block last
    assert kept == before["evaluation"].get("abilities_history", [])
    assert history["copy"] == old["copy"] and "passkey" not in history
    assert (package / "model.safetensors").read_bytes() == weights
    card = (package / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "| 512 | 192 | 0.500 | 1.000 | 5 |" in card and "measured again" in card
    files = sum(f.stat().st_size for f in package.iterdir() if f.is_file())
    assert after["package"]["directory_bytes"] == files
    assert not [p for p in package.parent.iterdir() if p.name.startswith(".model-")], "temporary folders left"


def test_other_weights_are_refused(tr, package, monkeypatch):
    monkeypatch.setattr(tr.abilities, "measure_abilities", fake_copy([]))
    prov = json.loads((package / "provenance.json").read_text(encoding="utf-8"))
    prov["package"]["weights_sha256"] = "0" * 64
    (package / "provenance.json").write_text(json.dumps(prov), encoding="utf-8")
    with pytest.raises(ValueError, match="provenance names 0000"):
        tr.main(["--remeasure-abilities", str(package), "--remeasure-parts", "copy"])


@pytest.mark.parametrize("parts", ["copy,copy", "recall", ""])
def test_bad_parts_are_named(tr, package, parts, capsys):
    with pytest.raises(SystemExit):
        tr.parse_args(["--remeasure-abilities", str(package), "--remeasure-parts", parts])
    assert (
        f"--remeasure-parts must be a comma list of copy, passkey, got {parts!r}" in capsys.readouterr().err
    )


def test_a_folder_without_a_package_is_named(tr, tmp_path, capsys):
    with pytest.raises(SystemExit):
        tr.parse_args(["--remeasure-abilities", str(tmp_path)])
    assert (
        "is not a packaged model: no model.safetensors, provenance.json, heldout.txt"
        in capsys.readouterr().err
    )
