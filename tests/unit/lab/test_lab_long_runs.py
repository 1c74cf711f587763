"""``kvlab lab --real`` and ``kvlab lab eviction`` are not silent: one progress line per step on
stderr off a terminal, a warning before the first forward when --tokens passes the model's
max_position_embeddings (``--real`` refuses it, exit 2, unless --allow-past-limit), and ``--real`` refuses (exit 2)
a size the machine's available memory cannot hold."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.lab.eviction import EvictionConfig, eviction_steps
from kvlab.lab.exactness import check_steps
from kvlab.models import reference_model_path
from kvlab.runtime import provenance

pytestmark = pytest.mark.skipif(
    not (reference_model_path() / "model.safetensors").is_file(),
    reason="the bundled reference model is absent",
)

STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+\d+ s  (.*)$")


def _run(argv: list[str]) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), [line for line in err.getvalue().splitlines() if line.strip()]


def limited_model(tmp_path: Path, positions: int) -> str:
    """The bundled model with its config's max_position_embeddings set to ``positions`` (weights linked)."""
    source, target = reference_model_path(), tmp_path / f"bundled-{positions}"
    target.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).is_file():
            (target / name).symlink_to(source / name)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    return str(target)


def test_real_check_prints_one_line_per_step():
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "8"])
    steps = [STEP.match(line) for line in err]
    assert code == 0 and all(steps), err  # nothing but progress lines: no warning within the limit
    assert [int(m[1]) for m in steps] == list(range(1, 2 + check_steps(8)))
    assert {int(m[2]) for m in steps} == {1 + check_steps(8)}
    assert steps[0][3] == "loading the bundled model in float32"
    assert steps[1][3] == "reference: one forward of 1 x 8 tokens, no cache"
    assert steps[2][3] == "dynamic: tokens 1-8 of 8"
    assert json.loads(out)["warnings"] == []


def test_eviction_prints_one_line_per_step():
    argv = ["--tokens", "20", "--window", "8", "--sinks", "2", "0"]
    code, out, err = _run(["lab", "eviction", "--json", *argv])
    steps = [STEP.match(line) for line in err]
    total = 1 + eviction_steps(EvictionConfig(tokens=20, window_length=8, sink_tokens=(2, 0)))
    assert code in (0, 1) and all(steps) and len(steps) == total, err
    names = [m[3] for m in steps]
    assert names[1] == "full context: one forward of 20 tokens (DynamicCache)"
    assert names[2] == "recompute last 8: prefix, windows 1-11 of 11"
    assert names[3] == "SinkCache 2 sinks + 8: tokens 1-20 of 20"
    assert json.loads(out)["config"]["tokens"] == 20


def test_real_check_past_the_positions_is_refused_before_the_load(tmp_path):
    """--tokens 100000 on a model of 8,192 positions warned, then spent 305 s on one reference forward with hours of
    decoding to go; now it is refused (exit 2) from the model's files, before the load, saying what to pass."""
    model = limited_model(tmp_path, 16)
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "20", "--model", model])
    assert code == 2 and out == "" and len(err) == 1, err  # no progress line: nothing was loaded
    assert err[0] == (
        "kvlab lab: error: --tokens 20 passes the model's max_position_embeddings (16): the check decodes positions "
        "the model was not trained on (the caches must still be exact there); pass --tokens 16 or less, or "
        "--allow-past-limit to run past it"
    )
    assert _run(["lab", "--real", "--json", "--tokens", "16", "--model", model])[0] == 0  # at the limit: runs


def test_real_check_past_the_positions_is_refused_after_the_load_where_the_files_do_not_say(tmp_path, monkeypatch):
    monkeypatch.setattr("kvlab.lab.longrun.configured_max_positions", lambda model: None)
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "20", "--model", limited_model(tmp_path, 16)])
    assert code == 2 and out == "", err
    assert err[-1].startswith("kvlab lab: error: --tokens 20 passes the model's max_position_embeddings (16): ")
    assert err[-1].endswith("pass --tokens 16 or less, or --allow-past-limit to run past it")
    assert not any("reference: one forward" in line for line in err)


def test_real_check_past_the_positions_with_the_flag_warns_once_before_the_first_forward(tmp_path):
    code, out, err = _run(
        ["lab", "--real", "--json", "--tokens", "20", "--model", limited_model(tmp_path, 16), "--allow-past-limit"]
    )
    warnings = [line for line in err if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1, err
    assert warnings[0].startswith("warning: --tokens 20 passes the model's max_position_embeddings (16): ")
    first_forward = next(i for i, line in enumerate(err) if "reference: one forward" in line)
    assert err.index(warnings[0]) < first_forward
    assert json.loads(out)["warnings"] == [warnings[0].removeprefix("warning: ")]


def test_eviction_past_the_positions_warns_once_before_the_first_forward(tmp_path):
    model = limited_model(tmp_path, 16)
    code, _, err = _run(["lab", "eviction", "--json", "--model", model, "--tokens", "20", "--window", "8"])
    warnings = [line for line in err if line.startswith("warning:")]
    assert code in (0, 1) and len(warnings) == 1, err
    assert warnings[0].startswith("warning: --tokens 20 passes the model's max_position_embeddings (16): ")
    assert err.index(warnings[0]) < next(i for i, line in enumerate(err) if "full context" in line)
    code, _, err = _run(["lab", "eviction", "--json", "--model", model, "--tokens", "16", "--window", "8"])
    assert not [line for line in err if line.startswith("warning:")], err  # at the limit: no warning


def test_an_absurd_size_is_refused_before_any_forward():
    """--tokens 10^9 on the bundled model: ~65 TB of logits; refused after the load, before the held-out cut."""
    code, out, err = _run(["lab", "--real", "--json", "--tokens", str(10**9), "--allow-past-limit"])
    assert code == 2 and out == ""
    assert err[-1].startswith("kvlab lab: error: --tokens 1,000,000,000 x --batch 1 (the reference's and ")
    assert "needs about" in err[-1] and "GiB available" in err[-1] and "tokens fit at --batch 1" in err[-1]
    assert not any("reference: one forward" in line for line in err)


def test_a_size_past_the_available_memory_is_refused(monkeypatch):
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 2**20)  # 1 MiB left
    code, out, err = _run(["lab", "--real", "--tokens", "8", "--batch", "2"])
    assert code == 2 and out == "", err
    message = err[-1]
    assert message.startswith("kvlab lab: error: --tokens 8 x --batch 2 "), message
    assert "of memory, the machine has 0.00 GiB available; " in message
    assert len([line for line in err if "error:" in line]) == 1
    assert [line for line in err if STEP.match(line)] == err[:-1] and len(err) == 2  # only the load ran
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: None)  # unknown: no check
    assert _run(["lab", "--real", "--json", "--tokens", "8"])[0] == 0
