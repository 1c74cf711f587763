"""``kvlab inspect --tokens`` past the model's max_position_embeddings (read from its files before loading) gets one
``warning:`` line on stderr before the work, and is inspected, not refused (as ``kvlab eval``); the work itself
is one progress step off a terminal."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.models import reference_model_path

pytestmark = pytest.mark.skipif(
    not (reference_model_path() / "model.safetensors").is_file(),
    reason="the bundled reference model is absent",
)


def _limited_model(tmp_path: Path, positions: int) -> str:
    """The bundled model with its config's max_position_embeddings set to ``positions`` (weights linked)."""
    source, target = reference_model_path(), tmp_path / f"bundled-{positions}"
    target.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).is_file():
            (target / name).symlink_to(source / name)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    return str(target)


def _run(argv: list[str]) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), [line for line in err.getvalue().splitlines() if line.strip()]


def test_tokens_past_the_positions_warn_once_before_the_work(tmp_path):
    model = _limited_model(tmp_path, 16)
    code, out, err = _run(["inspect", "--model", model, "--tokens", "20", "--json"])
    assert code == 0 and json.loads(out)["tokens"] == 20
    assert err[:2] == [
        "warning: --tokens 20 passes the model's max_position_embeddings (16): the K/V statistics include "
        "positions the model was not trained on",
        f"[1/2]      0 s  loading {Path(model).name}",
    ]
    assert len(err) == 3 and re.fullmatch(
        r"\[2/2\]\s+\d+ s  prefill of 20 tokens, K/V statistics of \d+ layers", err[2]
    )


def test_tokens_within_the_positions_and_a_prompt_do_not_warn(tmp_path):
    model = _limited_model(tmp_path, 16)
    for argv in (["--tokens", "16"], ["--prompt", "a short prompt of a few tokens"]):
        code, _, err = _run(["inspect", "--model", model, "--json", *argv])
        assert code == 0 and not [line for line in err if "warning" in line], err
