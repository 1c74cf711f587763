"""``kvlab plan MODEL --from-log FILE`` on input it cannot explain as given: planner flags it would ignore, a log
that lacks the lines it needs, and a log with the KV memory line more than once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.cli import main

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
GEMMA = [str(DATA / "configs" / "gemma-4-e2b.json"), "--from-log", str(DATA / "logs" / "log-gemma-4-e2b-l4.log")]
LLAVA = DATA / "configs" / "llava-v1.6-mistral-7b-hf.json"
LLAVA_LOG = DATA / "logs" / "log-llava-v1.6-mistral-7b-80gb.log"


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--context", "100"], "--context (drop --from-log to plan with it)"),
        (["--batch", "7"], "--batch (drop"),
        (["--measured-step-ms", "3"], "--measured-step-ms (drop"),
        (["--context", "100", "--batch", "7", "--measured-step-ms", "3"], "--context, --batch, --measured-step-ms"),
        (["--tp", "2", "--kv-dtype", "fp8"], "--kv-dtype, --tp (drop --from-log to plan with them)"),
        (["--emit", "vllm", "--block-size", "32"], "--emit, --block-size"),
    ],
)
def test_from_log_refuses_the_planner_flags_it_would_ignore(extra, named, capsys):
    """The log's own settings size what it printed: --context, --batch, --measured-step-ms ... were silently
    ignored (the same table, exit 0); they are refused as --list-gpus refuses them."""
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "22.49", *extra]) == 2
    err = capsys.readouterr().err
    assert "--from-log sets kvlab's model beside the log's KV lines, sized by the log's own settings" in err
    assert f"it takes no {named}" in err


def test_from_log_takes_gpu_mem_gib_only_where_the_log_does_not_state_the_memory(capsys):
    """The L4 log states no device memory: --gpu-mem-gib gives it. The llava log states 79.19 GiB, which won over
    --gpu-mem-gib silently; now the flag is refused."""
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "22.49", "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", str(LLAVA), "--from-log", str(LLAVA_LOG), "--gpu-mem-gib", "80"]) == 2
    err = capsys.readouterr().err
    assert f"--gpu-mem-gib 80 gives the device memory where the log does not; {LLAVA_LOG} states 79.19 GiB" in err
