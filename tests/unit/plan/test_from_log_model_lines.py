"""``kvlab plan MODEL --from-log FILE`` and the log's model statements: two different ones are two starts of vLLM
(refused naming both, as two values of a setting are), ``model=None`` states none, ``vllm serve`` options before the
model are skipped as vLLM's argparse skips them, and ``--force`` says in the output that it overrode the check;
MODEL given as a Hugging Face cache snapshot goes by the repo id of its ``models--ORG--NAME`` folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan.vllm_log import read_vllm_log

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
LLAVA = str(DATA / "configs" / "llava-v1.6-mistral-7b-hf.json")
LLAVA_LOG = (DATA / "logs" / "log-llava-v1.6-mistral-7b-80gb.log").read_text()
LLAVA_ID = "llava-hf/llava-v1.6-mistral-7b-hf"
ENGINE_LINE = f"model='{LLAVA_ID}'"


def _run(tmp_path: Path, capsys, text: str, *extra: str, model: str = LLAVA) -> tuple[int, str, str]:
    """``kvlab plan MODEL --from-log <text> [extra]``: (exit status, stdout, stderr)."""
    path = tmp_path / "vllm.log"
    path.write_text(text)
    code = main(["plan", model, "--from-log", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_two_different_model_statements_are_refused_naming_both_lines(tmp_path, capsys):
    """The gemma line after llava's was ignored (exit 0, the log explained as llava's)."""
    assert ENGINE_LINE in LLAVA_LOG
    text = LLAVA_LOG + "INFO engine config: model='google/gemma-3-1b-it'\n"
    code, out, err = _run(tmp_path, capsys, text)
    assert code == 2 and out == ""
    last = text.count("\n")
    assert f"{LLAVA_ID} (line 2, \"{ENGINE_LINE}\")" in err, err
    assert f"google/gemma-3-1b-it (line {last}, \"model='google/gemma-3-1b-it'\")" in err, err
    assert "one start of vLLM runs with one" in err


def test_the_same_model_stated_twice_is_read_once(tmp_path, capsys):
    code, _, err = _run(tmp_path, capsys, LLAVA_LOG + f"vllm serve {LLAVA_ID} --max-model-len 4096\n")
    assert code == 0, err


@pytest.mark.parametrize("unset", ["INFO args: {'model': None, 'seed': 0}", "INFO engine: model=None, seed=0"])
def test_a_model_set_to_none_states_no_model(unset, tmp_path, capsys):
    """'model': None was read as the model "None": "... is a log of None, not of MODEL"."""
    code, _, err = _run(tmp_path, capsys, unset + "\n" + LLAVA_LOG)
    assert code == 0 and "log of None" not in err, err
    assert read_vllm_log(unset + "\n" + LLAVA_LOG)["model"] == LLAVA_ID  # the line that states one


@pytest.mark.parametrize(
    "command",
    [
        "vllm serve --host 0.0.0.0 Qwen/Qwen2.5-7B-Instruct",
        "vllm serve --port=8000 --trust-remote-code Qwen/Qwen2.5-7B-Instruct --dtype auto",
        "vllm serve --enable-prefix-caching --tensor-parallel-size 1 Qwen/Qwen2.5-7B-Instruct",
    ],
)
def test_vllm_serve_options_before_the_model_are_skipped(command, tmp_path, capsys):
    """Options before the model hid it: the log named no model and was explained as llava's, exit 0."""
    assert read_vllm_log(command + "\nAvailable KV cache memory: 5.00 GiB\n")["model"] == "Qwen/Qwen2.5-7B-Instruct"
    code, _, err = _run(tmp_path, capsys, command + "\n" + LLAVA_LOG.replace(ENGINE_LINE, "x"))
    assert code == 2 and "is a log of Qwen/Qwen2.5-7B-Instruct (line 1," in err, err


def test_force_notes_that_the_model_check_was_overridden(tmp_path, capsys):
    """--force explained a log of another model with no word of it in the output."""
    text = LLAVA_LOG.replace(ENGINE_LINE, "model='google/gemma-3-1b-it'")
    code, out, _ = _run(tmp_path, capsys, text, "--force", "--json")
    assert code == 0
    forced = [n for n in json.loads(out)["notes"] if n.startswith("--force")]
    assert len(forced) == 1 and "overridden" in forced[0] and "google/gemma-3-1b-it" in forced[0], forced
    code, out, _ = _run(tmp_path, capsys, text, "--force")
    assert code == 0 and "model check was overridden" in out
    code, out, _ = _run(tmp_path, capsys, LLAVA_LOG, "--force", "--json")  # nothing overridden: no note
    assert code == 0 and not [n for n in json.loads(out)["notes"] if n.startswith("--force")]


def _hub_snapshot(tmp_path: Path) -> Path:
    """A Hugging Face hub cache snapshot of the llava config as huggingface_hub lays it out: the snapshot's
    config.json a symlink to a blob, the folders models--ORG--NAME/snapshots/<commit>."""
    repo = tmp_path / "hub" / ("models--" + LLAVA_ID.replace("/", "--"))
    blob = repo / "blobs" / "3f2a9c"
    blob.parent.mkdir(parents=True)
    blob.write_text(Path(LLAVA).read_text())
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)
    return snapshot


@pytest.mark.parametrize("what", ["config.json", "folder"])
def test_a_hub_cache_snapshot_goes_by_the_repo_id_of_its_folder(what, tmp_path, capsys):
    """MODEL as .../models--llava-hf--llava-v1.6-mistral-7b-hf/snapshots/<hash>[/config.json] was refused against
    llava's own log ("is a log of llava-hf/..., not of MODEL ..."): it went by the commit hash."""
    snapshot = _hub_snapshot(tmp_path)
    model = str(snapshot / "config.json") if what == "config.json" else str(snapshot)
    code, _, err = _run(tmp_path, capsys, LLAVA_LOG, "--json", model=model)
    assert code == 0, err
    other = LLAVA_LOG.replace(ENGINE_LINE, "model='google/gemma-3-1b-it'")  # still refused for another model
    code, _, err = _run(tmp_path, capsys, other, model=model)
    assert code == 2 and "is a log of google/gemma-3-1b-it" in err, err


@pytest.mark.parametrize(
    "draft",
    [
        "INFO engine: speculative_config=SpeculativeConfig(method='eagle', model='yuhuili/EAGLE-LLaMA3-8B', "
        "num_spec_tokens=(3)), seed=0",
        "INFO args: {'speculative_config': {'model': 'draft/tiny', 'num_speculative_tokens': 5}, 'seed': 0}",
        "vllm serve llava-hf/llava-v1.6-mistral-7b-hf --speculative-config '{\"model\": \"draft/tiny\"}' --port 1",
    ],
)
def test_a_speculative_draft_model_is_not_a_second_served_model(draft, tmp_path, capsys):
    """vLLM's engine line prints the draft model inside speculative_config: it is not a second start of vLLM."""
    text = LLAVA_LOG + draft + "\n"
    code, _, err = _run(tmp_path, capsys, text)
    assert code == 0, err
    assert read_vllm_log(text)["model"] == LLAVA_ID
    # the masking keeps a real second model after the draft's config refused
    code, _, err = _run(tmp_path, capsys, text + "INFO engine config: model='google/gemma-3-1b-it'\n")
    assert code == 2 and "google/gemma-3-1b-it" in err and "draft/tiny" not in err and "EAGLE" not in err
