"""``kvlab plan --kv-dtype mixed-<plan>``: a per-layer plan's bytes per token, per request, peak and fit, checked
against the one-dtype ledger on uniform plans and by brute force; ``--emit vllm`` of an FP8 plan with skipped
layers (flags vLLM's parser takes, tokens from vLLM's page arithmetic) and of a plan vLLM cannot express; bad
values refused in one line."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex

import pytest

from kvlab.cli import main
from kvlab.plan.kv_formats import kv_dtype
from kvlab.plan.ledger import kv_bytes, kv_bytes_peak, kv_bytes_per_token
from kvlab.plan.load import load_spec
from kvlab.plan.mixed import plan_kv_bytes
from kvlab.plan.mixed_report import MixedBytes, mixed_plan_report, vllm_expression
from kvlab.plan.report import plan_report
from kvlab.plan.vllm_kv import vllm_kv_cache

MODEL = "smollm2-135m"  # preset: 30 full-attention layers, 3 KV heads x 64, bf16
FP8_SKIP = {
    "layers": {
        "3": {"k": "float", "v": "float"},
        "10": {"k": "float", "v": "float"},
        "*": {"k": "fp8-e4m3", "v": "fp8-e4m3"},
    }
}
KIVI_MIX = {
    "layers": {
        "0": {"k": "kivi-8", "v": "kivi-4"},
        "1": {"k": "float", "v": "float"},
        "*": {"k": "kivi-4", "v": "kivi-2"},
    }
}


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """A plan folder with the plans above and one uniform plan per format, as ``$KVLAB_PLAN_DIR``."""
    written = {
        "fpskip": FP8_SKIP,
        "kivimix": KIVI_MIX,
        "allfloat": {"layers": {"*": {"k": "float", "v": "float"}}},
    }
    for fmt in ("kivi-4", "kivi-2", "fp8-e4m3"):
        written["all" + fmt.replace("-", "")] = {"layers": {"*": {"k": fmt, "v": fmt}}}
    written["wide"] = {"layers": {"40": {"k": "float", "v": "float"}, "*": {"k": "kivi-4", "v": "kivi-4"}}}
    written["short"] = {"layers": {str(i): {"k": "kivi-4", "v": "kivi-4"} for i in range(24)}}
    for name, plan in written.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(plan))
    monkeypatch.setenv("KVLAB_PLAN_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("plan", "uniform"),
    [("allkivi4", "kivi-4"), ("allkivi2", "kivi-2"), ("allfp8e4m3", "fp8-e4m3"), ("allfloat", "auto")],
)
def test_a_uniform_plan_reports_what_the_ledger_does(plans, plan, uniform):
    mixed = plan_report(MODEL, kv=f"mixed-{plan}", context=1000, batch=3, gpu_mem_gib=2)
    ledger = plan_report(MODEL, kv=uniform, context=1000, batch=3, gpu_mem_gib=2)
    for key in (
        "kv_bytes_per_token",
        "kv_bytes_total",
        "kv_bytes_peak_per_gpu",
        "max_batch",
        "max_context",
        "fits",
    ):
        assert mixed[key] == ledger[key], key
    assert mixed["kv_bytes_per_request_per_gpu"] == kv_bytes(load_spec(MODEL), 1000, 1, uniform)


def test_a_mixed_plan_sums_its_layers_and_its_peak_is_the_most_held_at_any_length(plans):
    spec = load_spec(MODEL)
    r = plan_report(MODEL, kv="mixed-kivimix", context=300, batch=2, gpu_mem_gib=1)
    formats = [(row["k"], row["v"]) for row in r["plan_layers"]]
    assert formats[:3] == [("kivi-8", "kivi-4"), ("float", "float"), ("kivi-4", "kivi-2")]
    assert r["kv_bytes_total"] == plan_kv_bytes(spec, formats, 300, 2) == sum(r["kv_bytes_per_layer_per_gpu"])
    sizes = MixedBytes(spec, formats, 32, 128, 1)
    assert r["kv_bytes_peak_per_gpu"] == max(sizes.total(t, 2) for t in range(301)) > r["kv_bytes_total"]
    elements = 2 * 3 * 64  # per token and layer
    per_layer = [
        kv_dtype(n, "bfloat16").bytes_per_element for n in ("kivi-k8v4", "bf16", *["kivi-k4v2"] * 28)
    ]
    assert r["kv_bytes_per_token"] == elements * sum(per_layer)
    assert (
        kv_bytes_per_token(spec, "kivi-k4v2") < r["kv_bytes_per_token"] < kv_bytes_per_token(spec, "kivi-8")
    )
    free = r["kv_budget_bytes_per_gpu"]
    assert sizes.peak(300) * r["max_batch"] <= free < sizes.peak(300) * (r["max_batch"] + 1)
    assert sizes.peak(r["max_context"], 2) <= free < sizes.peak(r["max_context"] + 1, 2)


def test_tensor_parallel_ranks_hold_their_share_of_the_kv_heads(plans):
    one = plan_report(MODEL, kv="mixed-kivimix", context=500, tp=1, weight_bytes_override=1)
    three = plan_report(MODEL, kv="mixed-kivimix", context=500, tp=3, weight_bytes_override=1)
    assert three["kv_bytes_total_per_gpu"] * 3 == one["kv_bytes_total_per_gpu"] == three["kv_bytes_total"]


def _vllm_parser() -> argparse.ArgumentParser:
    """The flags ``--emit vllm`` prints, declared as vLLM's ``EngineArgs`` declares them: ``--kv-cache-dtype``
    from ``CacheDType``'s literals, ``--kv-cache-dtype-skip-layers`` a ``list[str]`` field, so ``nargs="+"``
    (vllm/engine/arg_utils.py), the others single values."""
    p = argparse.ArgumentParser(prog="vllm", exit_on_error=False)
    p.add_argument("serve")
    p.add_argument("model")
    p.add_argument("--kv-cache-dtype", choices=["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"])
    p.add_argument("--kv-cache-dtype-skip-layers", nargs="+", type=str, default=[])
    for flag in (
        "--dtype",
        "--max-model-len",
        "--block-size",
        "--gpu-memory-utilization",
        "--max-num-seqs",
        "--tensor-parallel-size",
    ):
        p.add_argument(flag)
    return p


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's refusal
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_emit_vllm_of_an_fp8_plan_skips_its_float_layers_and_counts_vllm_tokens(plans):
    flags = "--kv-dtype mixed-fpskip --context 4096 --gpu-mem-gib 24 --reserve-gib 0 --emit vllm"
    code, out, err = _run(["plan", MODEL, *flags.split()])
    assert code == 0, err
    command = out.splitlines()[0]
    args = _vllm_parser().parse_args(shlex.split(command)[1:])
    assert (args.kv_cache_dtype, args.kv_cache_dtype_skip_layers) == ("fp8_e4m3", ["3", "10"])
    r = plan_report(MODEL, kv="mixed-fpskip", context=4096, gpu_mem_gib=24, emit="vllm")
    v = r["vllm"]
    assert v["expresses_plan"] and v["closest"] is None
    # vLLM's pages for block_size 16: 2 x 16 x 3 heads x 64 x (1 B fp8 | 2 B bf16); a block spans every layer
    page = 28 * (2 * 16 * 3 * 64 * 1) + 2 * (2 * 16 * 3 * 64 * 2)
    assert v["num_gpu_blocks"] == v["kv_memory_bytes_per_gpu"] // page
    assert v["kv_cache_tokens"] == v["num_gpu_blocks"] * 16
    assert f"{v['kv_cache_tokens']:,} tokens" in out
    spec = load_spec(MODEL)
    fp8 = vllm_kv_cache(spec, v["kv_memory_bytes_per_gpu"], max_model_len=4096, kv_cache_dtype="fp8")
    bf16 = vllm_kv_cache(spec, v["kv_memory_bytes_per_gpu"], max_model_len=4096)
    assert bf16.kv_cache_tokens < v["kv_cache_tokens"] < fp8.kv_cache_tokens
    assert (
        r["vllm"]["predicted_log"]["kv_cache_tokens"] < v["kv_cache_tokens"]
    )  # activations take their share


def test_emit_vllm_of_a_kivi_plan_states_the_closest_config(plans):
    r = plan_report(MODEL, kv="mixed-kivimix", context=4096, gpu_mem_gib=24, emit="vllm")
    v = r["vllm"]
    assert not v["expresses_plan"]
    assert v["closest"].startswith("closest vLLM configuration, not the plan") and "KIVI" in v["closest"]
    assert v["kv_cache_dtype"] == "fp8_e4m3" and v["kv_cache_dtype_skip_layers"] == [1]
    code, out, _ = _run(
        [
            "plan",
            MODEL,
            "--kv-dtype",
            "mixed-kivimix",
            "--context",
            "4096",
            "--gpu-mem-gib",
            "24",
            "--emit",
            "vllm",
        ]
    )
    assert code == 0 and out.startswith("# closest vLLM configuration, not the plan")
    assert vllm_expression([("float", "float")] * 3) == ("auto", (), [])
    allfloat = plan_report(MODEL, kv="mixed-allfloat", context=4096, gpu_mem_gib=24, emit="vllm")["vllm"]
    auto = plan_report(MODEL, kv="auto", context=4096, gpu_mem_gib=24, emit="vllm")["vllm"]
    assert allfloat["command"] == auto["command"] and allfloat["kv_cache_tokens"] == auto["kv_cache_tokens"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--kv-dtype", "mixed-nope"], "mixed-nope"),
        (["--kv-dtype", "mixed-wide"], "layer 40"),
        (["--kv-dtype", "mixed-short"], "layer 24"),
        (["--kv-dtype", "mixed-Bad_Name"], "mixed-Bad_Name"),
        (["--kv-dtype", "mixed-float_idx"], "must be one or two words of lower-case letters and digits"),
        (["--kv-dtype", "mixed-fpskip", "--keep-tokens", "100"], "--keep-tokens 100"),
    ],
)
def test_bad_plans_are_refused_in_one_line_naming_the_value(plans, argv, named):
    code, out, err = _run(["plan", MODEL, *argv])
    assert code == 2 and not out
    line = err.strip().splitlines()[-1]
    assert named in line, err
    assert "Traceback" not in err


def test_an_invalid_kv_dtype_lists_the_plan_pattern_among_the_choices():
    """argparse's "invalid choice" line names ``mixed-<plan>`` with the ledger's names (the pattern itself is no
    plan); a name of a KIVI or FP8 cache is the registry's to refuse (``kivi5``: the bits it takes)."""
    for value in ("hqq-4", "mixed-<plan>"):
        code, out, err = _run(["plan", MODEL, "--kv-dtype", value])
        assert code == 2 and not out
        assert "invalid choice" in err and "'mixed-<plan>')" in err.strip().splitlines()[-1]


def test_float_layers_of_an_fp8_plan_hold_bf16_bytes(plans):
    r = mixed_plan_report(MODEL, kv="mixed-fpskip", context=64)
    assert r["plan_summary"] == {"k": {"float": 2, "fp8-e4m3": 28}, "v": {"float": 2, "fp8-e4m3": 28}}
    assert (
        r["kv_bytes_peak_per_gpu"]
        == kv_bytes_peak(load_spec(MODEL), 64, 1, "fp8-e4m3")
        + 2
        * (kv_bytes(load_spec(MODEL), 64, 1, "bf16") - kv_bytes(load_spec(MODEL), 64, 1, "fp8-e4m3"))
        // 30
    )


def test_vllm_skip_layers_must_be_layers_of_the_model_and_are_space_separated():
    from kvlab.commands.sensitivity import vllm_flags

    with pytest.raises(ValueError, match="names layer 30, which the model lacks"):
        vllm_kv_cache(
            load_spec(MODEL), 10**9, max_model_len=64, kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=[30]
        )
    formats = [("fp8-e4m3",) * 2, ("float",) * 2, ("kivi-4",) * 2]
    assert vllm_expression(formats) == (
        "fp8-e4m3",
        (1,),
        [2],
    )
    layers = {
        "0": {"k": "float", "v": "float"},
        "1": {"k": "fp8-e4m3", "v": "fp8-e4m3"},
        "2": {"k": "float", "v": "float"},
    }
    assert vllm_flags(layers) == "--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 0 2"


def test_an_unknown_plan_says_where_plans_are_read_and_if_that_folder_is_missing(tmp_path, monkeypatch):
    from kvlab.plan.mixed import find_plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(
        "KVLAB_PLAN_DIR", "docs/examples/mixed/plans"
    )  # relative: from another folder, missing
    with pytest.raises(ValueError) as missing:
        find_plan("smollm2-fp8")
    where = tmp_path.resolve() / "docs" / "examples" / "mixed" / "plans"
    assert f"but the folder {where} does not exist" in str(missing.value)
    assert str(missing.value).startswith("unknown plan 'smollm2-fp8'; known: ")
    (tmp_path / "plans").mkdir()
    monkeypatch.setenv("KVLAB_PLAN_DIR", "plans")
    with pytest.raises(ValueError) as there:
        find_plan("smollm2-fp8")
    assert "does not exist" not in str(there.value)
    assert f"read from $KVLAB_PLAN_DIR=plans ({tmp_path.resolve() / 'plans'})" in str(there.value)
    monkeypatch.delenv("KVLAB_PLAN_DIR")
    with pytest.raises(ValueError, match=r"read from \$KVLAB_PLAN_DIR, which is not set"):
        find_plan("smollm2-fp8")


@pytest.mark.parametrize("version", [2, "1", True, None])
def test_a_plan_file_of_another_version_is_refused_naming_it(tmp_path, version):
    """A ``kvlab_plan`` this kvlab does not read (a newer format, a string, a bool) is refused with the file and the
    value named; a plan without the field is a hand-written one, read as the current version."""
    from kvlab.plan.mixed import PLAN_VERSION, read_plan

    layers = {"*": {"k": "kivi-4", "v": "kivi-4"}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kvlab_plan": version, "layers": layers}))
    with pytest.raises(
        ValueError, match=rf"p\.json' has kvlab_plan {re.escape(repr(version))}; this kvlab reads"
    ):
        read_plan(path)
    path.write_text(json.dumps({"layers": layers}))
    assert read_plan(path)["layers"] == layers
    path.write_text(json.dumps({"kvlab_plan": PLAN_VERSION, "layers": layers}))
    assert read_plan(path)["kvlab_plan"] == PLAN_VERSION


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("jamba-v0.1", "jamba-v0.1 has 28 layers without a KV cache (e.g. Mamba or convolution) (of 32)"),
        ("gemma-2-9b", "gemma-2-9b has 21 sliding-window layers (of 42)"),
    ],
)
def test_a_plan_on_a_model_with_other_layers_says_which_and_how_many(model, said):
    """The planner's kinds ('none', 'sliding') are not shown raw: the refusal counts the layers in words."""
    code, out, err = _run(["plan", model, "--kv-dtype", "mixed-demo"])
    assert code == 2 and not out
    assert err.strip().splitlines()[-1].endswith(f"full-attention layers only; {said}")


def test_emit_vllm_of_a_plan_with_one_kivi_layer_and_one_float_layer_says_it_in_the_singular(plans):
    """One substituted KIVI layer is "1 KIVI layer ... is stored", one skipped float layer "float layer 1"."""
    one = {
        "layers": {
            "0": {"k": "kivi-4", "v": "kivi-4"},
            "1": {"k": "float", "v": "float"},
            "*": {"k": "fp8-e4m3", "v": "fp8-e4m3"},
        }
    }
    (plans / "onekivi.json").write_text(json.dumps(one))
    closest = plan_report(MODEL, kv="mixed-onekivi", context=4096, gpu_mem_gib=24, emit="vllm")["vllm"][
        "closest"
    ]
    assert "the plan's 1 KIVI layer (kivi-4/kivi-4 keys/values) is stored as fp8" in closest
    assert "its float layer 1 skipped" in closest
    kivimix = plan_report(MODEL, kv="mixed-kivimix", context=4096, gpu_mem_gib=24, emit="vllm")["vllm"][
        "closest"
    ]
    assert (
        "the plan's 29 KIVI layers (" in kivimix
        and ") are stored as fp8 and its float layer 1 skipped" in kivimix
    )


def test_an_empty_plan_dir_is_said_to_be_empty_not_unset(monkeypatch):
    from kvlab.plan.mixed import find_plan

    monkeypatch.setenv("KVLAB_PLAN_DIR", "")
    with pytest.raises(ValueError, match=r"read from \$KVLAB_PLAN_DIR, which is set but empty"):
        find_plan("smollm2-fp8")


def test_an_unknown_plan_names_the_parameter_in_the_library_and_the_flag_in_the_cli(monkeypatch, capsys):
    """``resolve_plan`` (a library function) names its ``kv_dtype``; ``kvlab plan`` says ``--kv-dtype``."""
    from kvlab.plan.mixed_report import resolve_plan

    monkeypatch.delenv("KVLAB_PLAN_DIR", raising=False)
    with pytest.raises(ValueError) as info:
        resolve_plan("mixed-nosuch", load_spec("smollm2-135m"))
    assert str(info.value).startswith("`kv_dtype` 'mixed-nosuch' for smollm2-135m (30 layers): unknown plan")
    assert main(["plan", "smollm2-135m", "--kv-dtype", "mixed-nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab plan: error: --kv-dtype 'mixed-nosuch' for smollm2-135m (30 layers): unknown plan")


def test_a_plan_file_that_is_not_text_is_named(plans):
    """A binary plan file (UTF-16 from PowerShell's ``>``, or no text at all) said only "'utf-8' codec can't decode
    byte 0xff in position 0", naming neither the plan nor its file."""
    (plans / "binary.json").write_bytes(b"\xff\xfe{\x00}\x00")
    code, out, err = _run(["plan", MODEL, "--kv-dtype", "mixed-binary"])
    assert code == 2 and not out
    assert f"plan file '{plans / 'binary.json'}' is not JSON: not UTF-8 text at byte 0" in err, err
