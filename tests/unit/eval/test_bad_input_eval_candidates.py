"""Hostile ``kvlab eval --candidates`` / ``--threads`` values (the caches added today: fp8, kivi-kKvV, sink, snapkv,
tova, KIVI under SnapKV): refused before any work with ``error:`` naming the value and exit status 2, nothing
written; a spelling the error asks for is one the run accepts."""

from __future__ import annotations

import os

import pytest

from kvlab.cli import main


def dry(tmp_path, *argv):
    return main(["eval", "--dry-run", "--quick", "--no-long-context", "--out-dir", str(tmp_path), *argv])


def err_of(capsys):
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


@pytest.mark.parametrize(
    "candidate, fragment",
    [
        ("snapkv:token_budget=0", "`token_budget` must be an int >= 1, got 0"),
        ("tova:token_budget=0", "`token_budget` must be an int >= 1, got 0"),
        ("kivi-4:token_budget=0", "`token_budget` must be an int >= 1, got 0"),
        ("snapkv:compression_ratio=0.5:token_budget=10", "not both"),
        ("kivi-4:compression_ratio=0.5:token_budget=4", "not both"),
        ("snapkv:token_budget=16", "must be at least `window_size` (32)"),  # failed per cell at make
        ("tova:compression_ratio=1.5", "`compression_ratio` must be in (0, 1), got 1.5"),
        ("sink:window_length=0", "`window_length` must be an int >= 1, got 0"),
        ("fp8-e4m3:compression_ratio=0.5", "`fp8` settings are none"),
        ("fp8-e4m4", "'e4m4'"),
        ("kivi-k3v4", "k3v4"),
    ],
)
def test_bad_candidate_settings_are_refused_before_any_work(tmp_path, capsys, candidate, fragment):
    assert dry(tmp_path, "--candidates", f"dynamic,{candidate}") == 2
    err = err_of(capsys)
    assert err.startswith("kvlab eval: error:") and fragment in err and candidate in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_the_spelling_eval_asks_for_is_accepted(tmp_path, capsys):
    assert dry(tmp_path, "--candidates", "dynamic,snapkv:compression_ratio=0.00000010") == 2
    err = err_of(capsys)
    asked = err.split("as '")[1].split("'")[0]  # "write cache candidate ... as '<canonical>'"
    assert dry(tmp_path, "--candidates", f"dynamic,{asked}", "--label", "asked") == 0


def test_more_threads_than_the_machine_has_cpus_is_refused(tmp_path, capsys):
    # --threads 99999 was accepted and handed to torch.set_num_threads: tens of thousands of spinning OpenMP
    # threads on a shared machine (the run's own default leaves a core free for that reason)
    too_many = (os.cpu_count() or 1) * 1000
    assert dry(tmp_path, "--threads", str(too_many)) == 2
    err = err_of(capsys)
    assert "`threads`" in err and str(too_many) in err and list(tmp_path.iterdir()) == []
    assert dry(tmp_path, "--threads", "1", "--label", "one") == 0


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_bad_omp_num_threads_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, value):
    # without --threads the run reads OMP_NUM_THREADS; 'abc' loaded the model, then failed at run (exit 1) and
    # wrote a failed result file
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert dry(tmp_path) == 2
    err = err_of(capsys)
    assert "OMP_NUM_THREADS" in err and repr(value) in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "candidates, first, second",
    [
        ("dynamic,sink,sink:window_length=256", "'sink'", "'sink:window_length=256'"),  # 256: sink's default
        (
            "dynamic,sink:sink_tokens=4,sink:window_length=256",
            "'sink:sink_tokens=4'",
            "'sink:window_length=256'",
        ),
        ("dynamic,snapkv,snapkv:compression_ratio=0.5", "'snapkv'", "'snapkv:compression_ratio=0.5'"),
    ],
)
def test_one_cache_under_two_spellings_is_a_duplicate(tmp_path, capsys, candidates, first, second):
    """A setting written out at its default names the same cache: it would run (and be judged) twice."""
    assert dry(tmp_path, "--candidates", candidates) == 2
    err = err_of(capsys)
    assert "same cache" in err and first in err and second in err, err
    assert list(tmp_path.iterdir()) == []


def test_different_settings_are_not_duplicates(tmp_path):
    assert (
        dry(
            tmp_path,
            "--candidates",
            "dynamic,sink,sink:window_length=128,snapkv,snapkv:compression_ratio=0.25",
        )
        == 0
    )
    # KIVI with and without SnapKV in front of it are different caches (docs/EVICTION.md runs exactly this list)
    assert (
        dry(
            tmp_path,
            "--candidates",
            "dynamic,kivi-4,kivi-4:compression_ratio=0.5,kivi-4:token_budget=64",
            "--label",
            "kivi-snapkv",
        )
        == 0
    )


@pytest.mark.parametrize(
    "name, spelling", [("fp8_e4m3", "fp8-e4m3"), ("fp8_e5m2", "fp8-e5m2"), ("kivi_4", "kivi-4")]
)
def test_an_underscore_spelling_is_told_the_registry_spelling(tmp_path, capsys, name, spelling):
    # kvlab plan takes vLLM's fp8_e4m3; as an eval candidate it got only the generic grammar error
    assert dry(tmp_path, "--candidates", f"dynamic,{name}") == 2
    err = err_of(capsys)
    assert f"'{name}'" in err and f"'{spelling}'" in err, err
    assert dry(tmp_path, "--candidates", f"dynamic,{spelling}") == 0


@pytest.mark.parametrize(
    "candidate, kept",
    [
        ("sink:sink_tokens=4:window_length=4096", "4,100"),  # --quick: contexts 256,1024
        ("snapkv:token_budget=1024", "1,024"),
        ("tova:token_budget=2048", "2,048"),
        ("kivi-4:token_budget=4096", "4,096"),
    ],
)
def test_an_evicting_candidate_that_evicts_in_no_cell_is_refused(tmp_path, capsys, candidate, kept):
    # it would keep every token of every cell: measured as DynamicCache and judged a pass
    assert dry(tmp_path, "--candidates", f"dynamic,{candidate}") == 2
    err = err_of(capsys)
    assert repr(candidate) in err and kept in err and "evict" in err, err
    assert list(tmp_path.iterdir()) == []


def test_evicting_candidates_that_evict_somewhere_are_accepted(tmp_path):
    names = (
        "dynamic,sink,sink:sink_tokens=4:window_length=1000,snapkv:token_budget=1000,tova:token_budget=1000"
    )
    assert dry(tmp_path, "--candidates", names) == 0


@pytest.mark.parametrize(
    "argv, said",
    [
        # were: "duplicate cache candidates in [...]" and "label must be ...", no flag named
        (["--candidates", "dynamic,dynamic"], "`candidates` (--candidates) names 'dynamic' twice"),
        (["--label", "../x"], "`label` (--label) must be 1-100 characters"),
    ],
)
def test_a_refused_candidate_list_or_label_names_its_flag(tmp_path, capsys, argv, said):
    assert dry(tmp_path, *argv) == 2
    assert said in err_of(capsys)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_mixed_plan_gets_the_plan_folder_hint_kvlab_plan_gives(tmp_path, capsys, monkeypatch):
    """``mixed-<plan>`` naming no plan: eval says where plan files are read from, in kvlab plan's words (one helper,
    kvlab.plan.mixed.plan_dir_note)."""
    from kvlab.cli import main

    monkeypatch.delenv("KVLAB_PLAN_DIR", raising=False)
    argv = ["eval", "--candidates", "dynamic,mixed-ref-b3", "--dry-run", "--out-dir", str(tmp_path), "--label", "m"]
    hint = "(plan files are read from $KVLAB_PLAN_DIR, which is not set)"
    assert main(argv) == 2
    assert hint in " ".join(capsys.readouterr().err.split())
    assert main(["plan", "llama-3-8b", "--kv-dtype", "mixed-ref-b3"]) == 2
    assert hint in " ".join(capsys.readouterr().err.split())
    monkeypatch.setenv("KVLAB_PLAN_DIR", str(tmp_path / "nowhere"))
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"$KVLAB_PLAN_DIR={tmp_path / 'nowhere'}, but the folder" in err and "does not exist" in err
