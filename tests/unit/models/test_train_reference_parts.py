"""scripts/train_reference.py in its parts (reference_training/): the CLI still parses and prints its help, and
the training log's monitor measures with kvlab eval's own long-context probes (one probe, not a copy of it)."""

import subprocess
import sys

from kvlab import models
from kvlab.eval.longctx import RECALL_SPAN_TOKENS, recall_distances
from tests.unit.models.conftest import SCRIPT


def test_help_lists_every_group_and_exits_0():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in (
        "--curriculum",
        "--task-fraction",
        "--mid-copy-p",
        "--remeasure-abilities",
        "--package-only",
    ):
        assert flag in result.stdout
    assert "long-range tasks:" in result.stdout and "evaluation and output:" in result.stdout


def test_the_parts_are_the_scripts_names(tr):
    """What the tests use of the script is still reachable from it, defined once in its parts."""
    assert tr.TaskMixer.__module__ == "reference_training.mixture"
    assert tr.expand_layers.__module__ == "reference_training.loop"
    assert tr.abilities.measure_abilities.__module__ == "reference_training.abilities"
    assert not hasattr(tr, "probe_abilities"), "the monitor's own probe is gone: it uses kvlab.eval.longctx's"


def test_the_monitor_measures_with_kvlab_evals_probes(tr):
    model, tokenizer = models.load_model(None, dtype="bfloat16")
    ids = models.heldout_token_ids(tokenizer, 4096)
    got = tr.abilities.monitor_abilities(model, tokenizer, ids, 512, seed=0)
    distances = recall_distances(512, RECALL_SPAN_TOKENS, tr.abilities.ABILITY_PROTECTED_TAIL)
    assert sorted(got) == sorted([f"copy_{d}" for d in distances] + ["passkey_mid"])
    assert all(0.0 <= v <= 1.0 for v in got.values())
    again = tr.abilities.monitor_abilities(model, tokenizer, ids, 512, seed=0)
    assert again == got  # seeded: the same prompts and the same greedy answers
