"""A damaged copy of the bundled model (garbage weights, a config that does not match them, a tokenizer or config
file that is not JSON): every command that loads it says so in one line naming --model, the folder and the damage,
exit 2 — no SafetensorError / RuntimeError traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from kvlab.cli import main
from kvlab.models import ModelLoadError, load_model, reference_model_path


def _damaged(tmp_path, kind):
    folder = tmp_path / f"r_{kind}"
    shutil.copytree(reference_model_path(), folder)
    if kind == "weights":
        (folder / "model.safetensors").write_bytes(b"\xff" * 4096)
    elif kind == "heads":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3}))
    elif kind == "tokenizer":
        (folder / "tokenizer.json").write_text("garbage")
    else:
        (folder / "config.json").write_text((folder / "config.json").read_text()[:50])
    return folder


@pytest.mark.parametrize(
    "kind, said",
    [
        ("weights", "SafetensorError"),
        ("heads", "ignore_mismatched_sizes"),
        ("tokenizer", "JSONDecodeError"),
        ("config", "config.json"),
    ],
)
def test_load_model_names_the_folder_and_the_damage(tmp_path, kind, said):
    folder = _damaged(tmp_path, kind)
    with pytest.raises(ModelLoadError, match="cannot be loaded") as info:
        load_model(str(folder), dtype="float32")
    assert said in str(info.value) and str(folder) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, OSError)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "--tokens", "64"],
        ["tasks", "--quick", "--out", "{tmp}/t.json"],
        [
            "sensitivity",
            "sweep",
            "--out",
            "{tmp}/s.json",
            "--context",
            "256",
            "--prompts",
            "1",
            "--formats",
            "kivi-4",
        ],
        ["lab", "--real"],
    ],
)
def test_each_command_says_it_in_one_line_naming_the_flag(tmp_path, capsys, argv):
    folder = _damaged(tmp_path, "weights")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"error: --model {folder}: its config.json or weights are damaged" in err[-1], err
    assert "SafetensorError" in err[-1] and not any("Traceback" in line for line in err)
