"""Hostile input to ``kvlab plan`` / ``roofline`` / ``video`` and the planner library: every bad value gets a
``ValueError`` (the CLI: ``error: ...``, exit status 2) that names it; nothing crashes inside and no silent 0."""

from __future__ import annotations

import json
import re

import pytest

from kvlab.cli import main
from kvlab.plan.config_fields import check_int_at_least
from kvlab.plan.fit import budget_from_gib
from kvlab.plan.ledger import kv_bytes_per_token, quantized_tokens
from kvlab.plan.load import load_spec
from kvlab.plan.roofline import prefill_intensity
from kvlab.plan.spec import spec_from_config
from kvlab.plan.video import VideoClip

GIB = 1024**3
BASE = dict(
    model_type="llama",
    num_hidden_layers=2,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    intermediate_size=512,
)


def fails(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["plan", "llama-3-8b", "--gpu-mem-gib", "inf"], ("inf",)),
        (["plan", "llama-3-8b", "--gpu-mem-gib", "0"], ("--gpu-mem-gib", "got 0")),
        (["plan", "llama-3-8b", "--gpu-mem-gib", "-1"], ("--gpu-mem-gib", "got -1")),
        (["plan", "llama-3-8b", "--reserve-gib", "-2"], ("--reserve-gib", "-2")),
        (["plan", "llama-3-8b", "--gpu-mem-gib", "1e300"], ("1e+300",)),
        (["plan", "llama-3-8b", "--reserve-gib", "inf"], ("inf",)),
        (["plan", "llama-3-8b", "--gpu", ""], ("unknown GPU ''",)),
        (["plan", ""], ("''",)),
        (["plan", "llama-3-8b", "--tp", "64"], ("--tp (64)", "32")),
        (["roofline", "--tp", "0"], ("--tp", "0")),
        (["roofline", "--measured-step-ms", "inf"], ("--measured-step-ms", "inf")),
        (["roofline", "--context", "0"], ("--context", "got 0")),
        (["roofline", "--context", "-5"], ("--context", "got -5")),
        (["roofline", "--batch", "0"], ("--batch", "got 0")),
        (["roofline", "--batch", "-1"], ("--batch", "got -1")),
        # the GPU table once printed and silently ignored the model
        (["roofline", "--list-gpus", "--model", "mistral-7b"], ("takes no --model", "'mistral-7b'")),
        (["plan", "llama-3-8b", "--context", "0"], ("--context", "got 0")),
        (["video", "--seconds", "inf"], ("seconds", "inf")),
        (["video", "--seconds", "1e308"], ("seconds",)),
        (["video", "--seconds", "0.125"], ("3 frames", "--temporal-compression 4")),
        (["video", "--batch", "0"], ("batch", "0")),
    ],
)
def test_cli_bad_values_are_named(capsys, argv, fragments):
    fails(capsys, argv, *fragments)


def test_tp_beyond_the_kv_heads_still_replicates_when_it_divides_the_query_heads():
    llama = load_spec("llama-3-8b")  # 32 query heads, 8 KV heads
    assert kv_bytes_per_token(llama, tp=16) * 16 == 2 * 131072
    with pytest.raises(ValueError, match="query heads"):
        kv_bytes_per_token(llama, tp=1024)


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("num_hidden_layers", 1e400, "num_hidden_layers"),  # json reads 1e400 as inf
        ("num_hidden_layers", float("nan"), "num_hidden_layers"),
        ("hidden_size", float("inf"), "hidden_size"),
    ],
)
def test_non_finite_config_fields_are_named(tmp_path, capsys, field, value, fragment):
    path = tmp_path / "config.json"
    text = json.dumps(BASE | {field: 12345}).replace("12345", "1e400" if value == 1e400 else "NaN")
    if value == float("inf"):
        text = text.replace("NaN", "Infinity")
    path.write_text(text)
    fails(capsys, ["plan", str(path)], fragment)


@pytest.mark.parametrize(
    "name, kind", [("missing/", "model directory"), ("missing", "model directory"), ("c.json", "config file")]
)
def test_missing_local_path_says_it_does_not_exist(tmp_path, capsys, monkeypatch, name, kind):
    monkeypatch.chdir(tmp_path)
    for text in (f"./{name}", str(tmp_path / name)):
        fails(capsys, ["plan", text], kind, repr(text), "does not exist", str(tmp_path / name.rstrip("/")))
    if name.endswith(("/", ".json")):  # no ./ needed: a trailing slash or .json is a path, not a hub id
        fails(capsys, ["plan", name], kind, "does not exist")


def test_undecodable_config_names_the_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    fails(capsys, ["plan", str(path)], str(path))


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"intermediate_size": "abc"}, "intermediate_size"),
        ({"intermediate_size": -512}, "intermediate_size"),
        ({"intermediate_size": {}}, "intermediate_size"),
        ({"intermediate_size": [512]}, "intermediate_size"),  # one entry for two layers
        ({"intermediate_size": [512, "x"]}, "intermediate_size"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"vocab_size": 1.5}, "vocab_size"),
        ({"vocab_size": "x"}, "vocab_size"),
        ({"num_local_experts": -8, "num_experts_per_tok": 2}, "num_local_experts"),
        ({"num_local_experts": 8, "num_experts_per_tok": 20}, "num_experts_per_tok"),
    ],
)
def test_bad_weight_fields_are_named_not_estimated(override, fragment):
    with pytest.raises(ValueError, match=fragment):
        spec_from_config(BASE | override)


def test_valid_per_layer_intermediate_sizes_still_estimate():
    spec = spec_from_config(BASE | {"intermediate_size": [512, 1024]})
    assert spec.num_parameters > spec_from_config(BASE).num_parameters


@pytest.mark.parametrize("memory_gib, reserve_gib", [(float("inf"), 0.0), (1e300, 0.0), (80.0, float("inf"))])
def test_budget_from_gib_rejects_non_finite_sizes(memory_gib, reserve_gib):
    with pytest.raises(ValueError, match="GiB"):
        budget_from_gib(memory_gib, reserve_gib)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--reserve-gib", "100"], ("--reserve-gib 100", "A100-80GB", "81,920 MiB", "80.00 GiB")),
        (["--gpu", "h200", "--reserve-gib", "200"], ("--reserve-gib 200", "H200", "143,771 MiB")),
        (["--gpu-mem-gib", "16", "--reserve-gib", "16"], ("--reserve-gib 16", "--gpu-mem-gib 16")),
    ],
)
def test_reserve_not_below_the_gpu_memory_is_an_error_not_a_negative_budget(capsys, argv, fragments):
    fails(capsys, ["plan", "llama-3-8b", *argv], *fragments)


def test_gpu_budget_rejects_a_reserve_that_leaves_nothing():
    from kvlab.plan.fit import GpuBudget, budget_from_hardware
    from kvlab.plan.hardware import get_hardware

    with pytest.raises(ValueError, match="less than the GPU memory"):
        GpuBudget(memory_bytes=GIB, reserve_bytes=GIB)
    with pytest.raises(ValueError, match="`reserve_gib` 80"):  # the library names its parameter, not a flag
        budget_from_hardware(get_hardware("A100-80GB"), 80.0)
    # a reserve just under the memory is still a budget (nothing fits beside the weights, but it is no error)
    assert budget_from_gib(16.0, 15.5).reserve_bytes == int(15.5 * GIB)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: budget_from_gib(-1), "`memory_gib` must be a finite number of GiB > 0, got -1"),
        (lambda: budget_from_gib(80, -1), "`reserve_gib` must be a finite number of GiB >= 0, got -1"),
        (lambda: budget_from_gib(80, 90), r"the reserve \(`reserve_gib` 90\) is not less than the GPU memory "
         r"\(`memory_gib` 80 GiB\)"),
    ],
)
def test_budget_errors_name_the_library_parameter_not_a_flag(call, fragment):
    with pytest.raises(ValueError, match=fragment) as e:
        call()
    assert "--" not in str(e.value)


def test_kv_budget_takes_weight_bytes_or_names_what_to_pass():
    from kvlab.plan.weights import WeightBytes

    budget = budget_from_gib(80.0, 4.0)
    weights = WeightBytes(total_bytes=16 * GIB, active_bytes=16 * GIB, source="test")
    assert budget.kv_budget_bytes(weights) == budget.kv_budget_bytes(16 * GIB) == 60 * GIB
    assert budget.shortfall_note(WeightBytes(100 * GIB, 100 * GIB, "test")) == budget.shortfall_note(100 * GIB)
    for bad in (16.5e9, "16e9", -1, None):
        with pytest.raises(ValueError, match=r"`weight_bytes_per_gpu` must be .* WeightBytes \(kvlab.plan.weight_bytes"):
            budget.kv_budget_bytes(bad)


def test_video_clip_rejects_non_finite_and_empty_clips():
    for seconds in (float("inf"), 1e308):
        with pytest.raises(ValueError, match="seconds"):
            VideoClip(seconds)
    with pytest.raises(ValueError, match="no latent frame"):
        VideoClip(0.125)  # 3 frames, 4 frames per latent frame
    assert VideoClip(0.125, causal_first_frame=True).latent_frames == 1


def test_small_helpers_name_bad_arguments():
    with pytest.raises(ValueError, match="seq_len"):
        prefill_intensity(32, 32, 128, 8e9, 2, -1)
    with pytest.raises(ValueError, match="group_size"):
        quantized_tokens(500, 0, 128)


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "4", None])
def test_positive_int_check_names_the_value_and_the_flag(value):
    """One check for the planner's counts: a bool, a non-int or a value below 1 is refused with its name."""
    with pytest.raises(
        ValueError, match=rf"^`batch` must be a positive integer, got {re.escape(repr(value))}$"
    ):
        check_int_at_least("batch", value, 1)
    with pytest.raises(ValueError, match=r"^`batch` \(--batch\) must be a positive integer"):
        check_int_at_least("batch", value, 1, flag="--batch")
    assert check_int_at_least("batch", 3, 1) == 3


@pytest.mark.parametrize(
    "minimum, value, kind",
    [(0, -1, "a non-negative integer"), (0, 1.0, "a non-negative integer"), (2, 1, "an integer >= 2")],
)
def test_int_check_names_its_minimum(minimum, value, kind):
    """The same check with another minimum: 0 for a count that may be empty, any other named as a bound."""
    with pytest.raises(ValueError, match=rf"^`tokens` must be {kind}, got {re.escape(repr(value))}$"):
        check_int_at_least("tokens", value, minimum)
    assert check_int_at_least("tokens", minimum, minimum) == minimum


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "inf"], ("--bandwidth-gb-s", "inf")),
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "-1"], ("--bandwidth-gb-s", "-1")),
        (["roofline", "--bandwidth-gb-s", "inf"], ("--bandwidth-gb-s", "inf")),
        (["roofline", "--bandwidth-gb-s", "1000", "--tflops", "inf"], ("--tflops", "inf")),
        (["plan", "llama-3-8b", "--block-size", "32"], ("--block-size 32", "--emit vllm")),
    ],
)
def test_flags_are_named_as_given(capsys, argv, fragments):
    err = fails(capsys, argv, *fragments)
    assert "bandwidth_tb_s" not in err and "tflops_16bit" not in err


def test_emit_vllm_refuses_a_config_file_not_named_config_json(tmp_path, capsys):
    from kvlab.models import reference_model_path

    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "same_layers.json").write_text((reference_model_path() / "config.json").read_text())
    assert main(["plan", str(cfg / "same_layers.json")]) == 0  # the plan itself reads any file name
    capsys.readouterr()
    fails(
        capsys,
        ["plan", str(cfg / "same_layers.json"), "--emit", "vllm"],
        str(cfg / "same_layers.json"),
        "config.json",
    )


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("kivi-k3v4", r"KIVI bits must be in \[2, 4, 8\], got 3"),
        ("kivi-k8v16", r"KIVI bits must be in \[2, 4, 8\], got 16"),
        ("fp8-e4m4", "got 'fp8-e4m4'"),
        ("fp8_e3m4", "got 'fp8_e3m4'"),
        ("fp8-e4m3:group_size=4", "got 'fp8-e4m3:group_size=4'"),
    ],
)
def test_fp8_and_asymmetric_kivi_kv_dtypes_name_the_bad_value(name, match):
    from kvlab.plan.kv_formats import kv_dtype

    with pytest.raises(ValueError, match=match):
        kv_dtype(name)


def test_fp8_kv_dtype_bytes_in_the_plan_cli(capsys):
    """--kv-dtype fp8_e4m3: 1 B/element plus 4 B per scale (per-head: layers x 2 x kv_heads per sequence)."""
    from kvlab.models import reference_model_path

    cfg = str(reference_model_path() / "config.json")
    spec = load_spec(cfg)
    reports = {}
    for kv in ("bf16", "fp8_e4m3", "fp8-e4m3-unscaled"):
        assert main(["plan", cfg, "--context", "4096", "--batch", "2", "--kv-dtype", kv, "--json"]) == 0
        reports[kv] = json.loads(capsys.readouterr().out)
    total = {kv: r["kv_bytes_total_per_gpu"] for kv, r in reports.items()}
    scales = 2 * spec.kv_layers * 2 * spec.num_kv_heads * 4  # batch x layers x (K, V) x heads x fp32
    assert 2 * total["fp8-e4m3-unscaled"] == total["bf16"]
    assert total["fp8_e4m3"] == total["fp8-e4m3-unscaled"] + scales
    meta = {kv: r["kv_metadata_bytes_total"] for kv, r in reports.items()}
    assert meta == {"bf16": 0, "fp8_e4m3": scales, "fp8-e4m3-unscaled": 0}
    assert main(["plan", cfg, "--context", "4096", "--batch", "2", "--kv-dtype", "fp8_e4m3"]) == 0
    shown = capsys.readouterr().out
    assert "of which FP8 scales (per-head, fp32)" in shown and f"{scales:,} B" in shown


def test_quantized_note_names_the_weight_source_the_user_gave():
    from kvlab.plan.report import plan_report

    hint = "pass --weight-dtype or --weights-index"
    plain = plan_report("deepseek-v3", context=4096)
    assert any(hint in n for n in plain["notes"])
    given = plan_report("deepseek-v3", context=4096, weight_dtype="fp8")
    notes = [n for n in given["notes"] if "checkpoint is quantized" in n]
    assert notes and hint not in notes[0] and notes[0].endswith("weights sized from --weight-dtype fp8")


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline", "--model", "llama-3-8b"]])
@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--kv-dtype", "fp8-e4m3", "--group-size", "64"], ("--group-size 64", "fp8-e4m3")),
        (["--kv-dtype", "bf16", "--residual", "256"], ("--residual 256", "bf16")),
    ],
)
def test_kivi_flags_with_another_kv_dtype_are_refused_not_ignored(capsys, command, argv, fragments):
    # --group-size/--residual size only a KIVI cache; with fp8/bf16 they were silently ignored (exit 0)
    fails(capsys, [*command, *argv], *fragments, "kivi")


def test_kivi_flags_still_apply_to_kivi(capsys):
    assert main(["plan", "llama-3-8b", "--kv-dtype", "kivi-k8v4", "--group-size", "64", "--json"]) == 0
    wide = json.loads(capsys.readouterr().out)
    assert main(["plan", "llama-3-8b", "--kv-dtype", "kivi-k8v4", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert wide != default  # G = 64 halves the scale/zero metadata


@pytest.mark.parametrize(
    "argv, flag, value",
    [
        (["plan", "llama-3-8b", "--kv-dtype", "kivi-4", "--group-size", "0"], "--group-size", "0"),
        (["plan", "llama-3-8b", "--kv-dtype", "kivi-4", "--group-size", "3"], "--group-size", "3"),
        (["plan", "llama-3-8b", "--kv-dtype", "kivi-4", "--residual", "48"], "--residual", "48"),
        (["roofline", "--kv-dtype", "kivi-k8v4", "--residual", "-4"], "--residual", "-4"),
        (["plan", "llama-3-8b", "--tp", "0"], "--tp", "0"),
        (["plan", "llama-3-8b", "--kv-heads", "0"], "--kv-heads", "0"),
        (["plan", "llama-3-8b", "--kv-heads", "3"], "--kv-heads", "3"),
        (["plan", "deepseek-v3", "--kv-heads", "2"], "--kv-heads", "MLA"),
        (["plan", "llama-3-8b", "--measured-step-ms", "0"], "--measured-step-ms", "0"),
        (["plan", "llama-3-8b", "--weight-dtype", "int3"], "--weight-dtype", "int3"),
        (["plan", "llama-3-8b", "--reserve-gib", "-1"], "--reserve-gib", "-1"),
        (["video", "--fps", "0"], "--fps", "0"),
        (["video", "--temporal-compression", "0"], "--temporal-compression", "0"),
        (["video", "--kv-dtype", "kivi-4", "--group-size", "0"], "--group-size", "0"),
    ],
)
def test_planner_errors_name_the_flag_not_the_library_argument(capsys, argv, flag, value):
    """The planner library names its arguments (`group_size`); the CLI user typed a flag (--group-size)."""
    err = fails(capsys, argv, flag, value)
    assert err.count(flag) == 1, err  # named once, not "`reserve_gib` (--reserve-gib)" twice over
    for name in ("`group_size`", "`residual_length`", "`tp`", "`num_kv_heads`", "`measured_step_ms`"):
        assert name not in err, err


@pytest.mark.parametrize("value", ["inf", "1e400", "-inf", "nan", "abc"])
def test_weight_bytes_that_is_not_a_finite_count_is_refused_by_flag(capsys, value):
    with pytest.raises(SystemExit) as exc:  # argparse refuses it (was an OverflowError traceback for inf)
        main(["plan", "llama-3-8b", f"--weight-bytes={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--weight-bytes" in err and repr(value) in err and "_byte_count" not in err, err


def test_weight_bytes_keeps_an_exact_large_integer(capsys):
    exact = "123456789012345678901"  # not representable as a float: parsed as an int, not rounded
    assert main(["plan", "llama-3-8b", "--weight-bytes", exact, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == int(exact)


def test_emit_vllm_refuses_a_context_one_request_cannot_hold(capsys):
    # 4,432 tokens of KV fit in 17 GiB less 1.5 GiB and the 14.96 GiB of weights: vLLM refuses to start with
    # --max-model-len 8,192 (its KV cache cannot hold one request); the note used to say it would "run fewer
    # sequences at a time"
    argv = ["plan", "llama-3-8b", "--emit", "vllm", "--context", "8192", "--gpu-mem-gib", "17", "--reserve-gib", "1.5"]
    err = fails(capsys, argv, "--context", "8,192")
    assert "4,432" in err and "refuses to start" in err, err
    assert capsys.readouterr().out == ""  # no command printed that cannot run


def test_emit_vllm_still_plans_a_context_that_fits_once(capsys):
    argv = ["plan", "llama-3-8b", "--emit", "vllm", "--gpu-mem-gib", "18", "--reserve-gib", "2", "--json"]
    assert main(argv) == 0
    assert 1 <= json.loads(capsys.readouterr().out)["vllm"]["max_concurrency"] < 2


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
def test_keep_tokens_not_below_the_context_says_nothing_is_evicted(capsys, command):
    # --keep-tokens 99,999,999 at --context 8192: the cache keeps all 8,192 tokens (roofline's table said
    # "KV kept per layer: 99,999,999 tokens", no word that the cap changes nothing at this context)
    assert main([*command, "--keep-tokens", "99999999", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("--keep-tokens 99,999,999" in n and "8,192" in n and "evicts nothing" in n for n in notes), (
        notes
    )
    assert main([*command, "--keep-tokens", "4096", "--json"]) == 0
    assert not any("evicts nothing" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_roofline_shows_the_tokens_a_capped_cache_keeps_at_this_context(capsys):
    assert main(["roofline", "--keep-tokens", "99999999"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "KV kept per layer │ 8,192 tokens" in out and "99,999,999 tokens" not in out.split("note:")[0], out


def _safetensors(path, header: bytes) -> str:
    import struct

    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return str(path)


@pytest.mark.parametrize(
    "header, fragment",
    [
        (b'{"a": 1}', "'a'"),  # was TypeError: 'int' object is not subscriptable
        (b'{"a": {"dtype": "F16"}}', "'a'"),  # no data_offsets: was KeyError
        (b'{"a": {"data_offsets": [10, 2]}}', "[10, 2]"),  # a negative size
        (b"[1, 2]", "header"),  # not an object
    ],
)
def test_a_malformed_safetensors_header_is_named(tmp_path, capsys, header, fragment):
    path = _safetensors(tmp_path / "w.safetensors", header)
    fails(capsys, ["plan", "llama-3-8b", "--weights-index", path], "w.safetensors", fragment)


def test_a_safetensors_header_longer_than_the_file_is_named(tmp_path, capsys):
    import struct

    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    fails(capsys, ["plan", "llama-3-8b", "--weights-index", str(path)], "w.safetensors", f"{2**63:,}")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{bad", "not valid JSON"),  # was only json's "Expecting property name ..." with no file named
        ('{"metadata": {"total_size": Infinity}}', "inf"),  # was OverflowError
        ('{"metadata": {"total_size": NaN}}', "nan"),
    ],
)
def test_a_bad_index_json_names_the_file(tmp_path, capsys, text, fragment):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(text)
    fails(
        capsys, ["plan", "llama-3-8b", "--weights-index", str(path)], "model.safetensors.index.json", fragment
    )


def test_weight_bytes_and_weights_index_together_are_refused(tmp_path, capsys):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text('{"metadata": {"total_size": 1000}}')
    # --weight-bytes silently won over --weights-index
    fails(
        capsys,
        ["plan", "llama-3-8b", "--weights-index", str(path), "--weight-bytes", "5"],
        "--weight-bytes",
        "--weights-index",
    )


@pytest.mark.parametrize(
    "argv, flag, value",
    [
        # each was a ZeroDivisionError: the rate rounds to 0 whole B/s or FLOP/s
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "1e-10", "--tflops", "100"], "--bandwidth-gb-s", "1e-10"),
        (["roofline", "--bandwidth-gb-s", "1e-300", "--tflops", "1e-300"], "--bandwidth-gb-s", "1e-300"),
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "100", "--tflops", "1e-13"], "--tflops", "1e-13"),
        (["roofline", "--bandwidth-gb-s", "100", "--tflops", "1e-13"], "--tflops", "1e-13"),
        # was "`bandwidth_bytes_s` must be > 0, got 0.0"
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "1e-10"], "--bandwidth-gb-s", "1e-10"),
        # inf once in B/s or FLOP/s: was an OverflowError in round()
        (["plan", "llama-3-8b", "--bandwidth-gb-s", "1e300"], "--bandwidth-gb-s", "1e+300"),
        (["roofline", "--bandwidth-gb-s", "100", "--tflops", "1e297"], "--tflops", "1e+297"),
    ],
)
def test_a_device_rate_that_rounds_to_zero_or_overflows_is_named_by_flag(capsys, argv, flag, value):
    err = fails(capsys, argv, flag, f"got {value}")
    assert "`" not in err and "Traceback" not in err, err


def test_the_smallest_device_rates_still_plan(capsys):
    argv = ["plan", "llama-3-8b", "--bandwidth-gb-s", "1e-9", "--tflops", "1e-12", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["gpu"]["ridge_flop_per_byte"] == 1.0 and r["bandwidth_bytes_s"] == 1.0


def test_library_rates_that_would_divide_by_zero_are_named():
    from kvlab.plan.hardware import Hardware, custom_hardware
    from kvlab.plan.roofline import DecodeStepBound, ridge_point_flop_per_byte

    with pytest.raises(ValueError, match="`bandwidth_gb_s` must be at least 1e-09 GB/s.*got 1e-10"):
        custom_hardware(1e-10, 100)
    with pytest.raises(ValueError, match="`tflops` must be at least 1e-12 TFLOP/s.*got 1e-13"):
        custom_hardware(100, 1e-13)
    with pytest.raises(ValueError, match="`tflops_16bit`"):
        Hardware("x", 1e-300, 1.0, None, "")
    with pytest.raises(ValueError, match="`bandwidth_tb_s`"):
        Hardware("x", 1.0, 1e-300, None, "")
    with pytest.raises(ValueError, match="`peak_flops` must be a finite number > 0, got 0.0"):
        DecodeStepBound(10, 10, 1, 1e12, flops_per_step=1e9, peak_flops=0.0)
    with pytest.raises(ValueError, match="`bandwidth_bytes_s`"):
        ridge_point_flop_per_byte(1e12, float("inf"))


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
@pytest.mark.parametrize("ms", ["1e-300", "5e-324"])
def test_a_measured_step_giving_infinite_ratios_is_refused(capsys, command, ms):
    # was a 300-digit percentage, "inf GB/s" and, with --json, `Infinity` (not JSON)
    err = fails(
        capsys, [*command, "--measured-step-ms", ms, "--json"], f"--measured-step-ms {ms}", "infinite"
    )
    assert capsys.readouterr().out == "" and "`" not in err


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
def test_a_measured_step_faster_than_the_bound_is_warned_about(capsys, command):
    # --measured-step-ms 1 printed "840.3% of bound; 17,134.3 GB/s achieved" and nothing else
    assert main([*command, "--measured-step-ms", "1", "--json"]) == 0
    captured = capsys.readouterr()
    m = json.loads(captured.out)["measured"]
    assert m["faster_than_bound"] is True and "faster than the decode step lower bound" in m["warning"]
    assert "warning: measured step 1 ms is faster than the decode step lower bound" in captured.err
    assert "2039 GB/s" in captured.err  # the A100-80GB bandwidth the bound assumes
    assert main([*command, "--measured-step-ms", "1"]) == 0
    captured = capsys.readouterr()
    assert "FASTER THAN THE BOUND" in captured.out and "warning:" in captured.err


def test_a_measured_step_slower_than_the_bound_has_no_warning(capsys):
    assert main(["roofline", "--measured-step-ms", "10", "--json"]) == 0
    captured = capsys.readouterr()
    m = json.loads(captured.out)["measured"]
    assert m["faster_than_bound"] is False and m["warning"] is None and "warning" not in captured.err


@pytest.mark.parametrize("layers", [10**30, 10**8, 100_001])
def test_an_absurd_layer_count_is_refused_naming_the_field(tmp_path, capsys, layers):
    # 10**30 was an OverflowError in _layer_kinds; 10**8 ran for minutes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE | {"num_hidden_layers": layers}))
    fails(capsys, ["plan", str(path)], "`num_hidden_layers`", f"got {layers:,}", "100,000")


def test_a_per_layer_list_longer_than_the_bound_is_named(tmp_path):
    cfg = {k: v for k, v in BASE.items() if k != "num_hidden_layers"} | {
        "layer_types": ["full_attention"] * 100_001
    }
    with pytest.raises(ValueError, match="length of config field `layer_types`.*100,001"):
        spec_from_config(cfg)


def test_the_largest_layer_count_still_plans():
    assert spec_from_config(BASE | {"num_hidden_layers": 100_000}).num_layers == 100_000


def test_a_clip_length_given_twice_is_named(capsys):
    assert main(["video", "--seconds", "5", "5", "10"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--seconds lists 5 more than once, got 5 5 10" in err  # as typed (was "5.0 ... [5.0, 5.0, 10.0]")


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
@pytest.mark.parametrize(
    "custom, named",
    [
        (["--bandwidth-gb-s", "100"], ("--bandwidth-gb-s 100",)),
        (["--tflops", "5"], ("--tflops 5",)),
        (["--bandwidth-gb-s", "100", "--tflops", "5"], ("--bandwidth-gb-s 100", "--tflops 5")),
    ],
)
def test_a_gpu_with_custom_device_flags_is_refused_naming_both(capsys, command, custom, named):
    # was: --gpu silently dropped for a "custom" device without memory
    fails(capsys, [*command, "--gpu", "h100", *custom], "--gpu h100", *named, "pass one")


@pytest.mark.parametrize("listing", ["--list-presets", "--list-gpus"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_model_with_a_list_flag_is_refused_naming_it(capsys, listing, json_flag):
    # was: the table printed, the model silently ignored
    err = fails(capsys, ["plan", listing, *json_flag, "llama-3-8b"], listing, "'llama-3-8b'")
    assert "┏" not in capsys.readouterr().out + err
    assert main(["plan", listing]) == 0  # alone it still prints the table


CONTEXT_WARNING = "--context 100,000 is beyond llama-3-8b's max_position_embeddings 8,192"


@pytest.mark.parametrize("argv", [["plan", "llama-3-8b"], ["roofline"]])
def test_a_context_beyond_the_model_limit_is_planned_with_a_warning(capsys, argv):
    assert main([*argv, "--context", "100000", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["context"] == 100_000 and len(r["warnings"]) == 1 and CONTEXT_WARNING in r["warnings"][0]
    assert f"warning: {CONTEXT_WARNING}" in captured.err
    assert main([*argv, "--context", "8192", "--json"]) == 0  # at the limit: no warning
    captured = capsys.readouterr()
    assert json.loads(captured.out)["warnings"] == [] and "warning" not in captured.err


def test_video_clips_beyond_the_model_limit_are_warned_about(capsys):
    # 64x64 at 8x: 64 tokens per latent frame; 24 fps / 4: 6 latent frames per second
    argv = ["video", "--width", "64", "--height", "64", "--seconds", "1", "30", "60"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert [c["tokens"] for c in r["clips"]] == [384, 11_520, 23_040]
    (warning,) = r["warnings"]
    assert "30 s clip (11,520 tokens), the 60 s clip (23,040 tokens) are beyond" in warning
    assert "1 s clip" not in warning and "max_position_embeddings 8,192" in warning
    err = " ".join(captured.err.split())
    assert (
        "kvlab video: warning: the 30 s clip (11,520 tokens)" in err
        and "max_position_embeddings 8,192" in err
    )
    assert main([*argv[:-2], "--json"]) == 0  # 1 s only: within the limit
    assert json.loads(capsys.readouterr().out)["warnings"] == []


@pytest.mark.parametrize(
    ("argv", "keys"),
    [
        (["plan", "--list-presets", "--json"], ["presets"]),
        (["plan", "--list-gpus", "--json"], ["gpus"]),
        (["plan", "--list-presets", "--list-gpus", "--json"], ["presets", "gpus"]),
        (["roofline", "--list-gpus", "--json"], ["gpus"]),
    ],
)
def test_lists_honour_json_and_both_flags(capsys, argv, keys):
    from kvlab.plan import presets
    from kvlab.plan.hardware import HARDWARE

    assert main(argv) == 0
    listing = json.loads(capsys.readouterr().out)
    assert list(listing) == keys
    if "presets" in listing:
        assert [p["name"] for p in listing["presets"]] == [p.name for p in presets.PRESETS.values()]
    if "gpus" in listing:
        assert [g["name"] for g in listing["gpus"]] == [h.name for h in HARDWARE]


def test_both_lists_print_both_tables(capsys):
    assert main(["plan", "--list-presets", "--list-gpus"]) == 0
    out = capsys.readouterr().out
    assert "Built-in presets" in out and "Hardware table" in out


def test_a_rotated_fp8_cache_on_a_head_dim_it_cannot_rotate_is_refused(tmp_path, capsys):
    """``fp8-e4m3-hadamard`` needs a power-of-two head_dim (the cache refuses 48; the plan once sized it anyway)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**BASE, "head_dim": 48}))
    fails(
        capsys,
        ["plan", str(config), "--kv-dtype", "fp8-e4m3-hadamard"],
        "error: --kv-dtype 'fp8-e4m3-hadamard': a Hadamard rotation needs a power-of-two head_dim",
        "is 48",
    )
    with pytest.raises(ValueError) as info:  # the library names its parameter, not the CLI's flag
        kv_bytes_per_token(spec_from_config({**BASE, "head_dim": 48}), "fp8-e4m3-hadamard")
    assert str(info.value).startswith("`kv_dtype` 'fp8-e4m3-hadamard': ") and "--" not in str(info.value)
    assert main(["plan", str(config), "--kv-dtype", "fp8-e4m3"]) == 0  # the plain cache has no such limit
    spec = spec_from_config({**BASE, "head_dim": 64})
    assert kv_bytes_per_token(spec, "fp8-e4m3-hadamard") == kv_bytes_per_token(spec, "fp8-e4m3")


def test_planner_counts_refuse_a_bool_named():
    """``True`` is an int to Python: the planner's counts refuse it as they refuse 0, naming the field."""
    from kvlab.plan.fit import GpuBudget, max_context
    from kvlab.plan.ledger import paged_kv_bytes
    from kvlab.plan.probe import probe
    from kvlab.plan.roofline import DecodeStepBound

    spec = spec_from_config(BASE)
    calls = {
        "memory_bytes": lambda: GpuBudget(memory_bytes=True, reserve_bytes=0),
        "batch": lambda: max_context(spec, True, 10**9),
        "block_size_tokens": lambda: paged_kv_bytes(spec, 64, block_size_tokens=True),
        "repeat": lambda: probe(repeat=True),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"^`{name}` must be a positive integer, got True$"):
            call()
    with pytest.raises(ValueError, match=r"^`batch` must be a positive integer, got True$"):
        DecodeStepBound(weight_bytes=1, kv_bytes=1, bandwidth_bytes_s=1e9, batch=True)


# counts that returned a wrong number silently (a negative byte count, a float batch, a NaN budget): now refused,
# the argument named
_BAD_COUNTS = [-1, 2.5, True, float("nan"), float("inf")]


@pytest.mark.parametrize("batch", _BAD_COUNTS)
def test_kivi_kv_bytes_refuses_a_batch_that_is_not_a_count(batch):
    from kvlab.plan.ledger import kivi_kv_bytes, kivi_kv_bytes_breakdown

    spec = load_spec("llama-3-8b")
    for fn in (kivi_kv_bytes, kivi_kv_bytes_breakdown):
        with pytest.raises(
            ValueError, match=r"`batch` must be a non-negative integer, got " + re.escape(repr(batch))
        ):
            fn(spec, 1024, batch=batch)


@pytest.mark.parametrize(
    "tokens, residual, name",
    [
        (100, -32, "residual_length"),
        (100, 32.0, "residual_length"),
        (-5, 32, "tokens"),
        (True, 0, "tokens"),
        (float("inf"), 32, "tokens"),
        (100, True, "residual_length"),
    ],
)
def test_quantized_tokens_refuses_counts_that_are_not_ints_ge_0(tokens, residual, name):
    from kvlab.plan.ledger import quantized_tokens

    with pytest.raises(ValueError, match=f"`{name}` must be a non-negative integer"):
        quantized_tokens(tokens, 32, residual)


@pytest.mark.parametrize("budget", [2.5, float("nan"), float("inf"), True])
def test_max_batch_and_max_context_refuse_a_budget_that_is_not_an_int(budget):
    from kvlab.plan.fit import max_batch, max_context

    spec = load_spec("llama-3-8b")
    with pytest.raises(
        ValueError, match=r"`kv_budget_bytes` must be an integer, got " + re.escape(repr(budget))
    ):
        max_batch(spec, 1024, kv_budget_bytes=budget)
    with pytest.raises(
        ValueError, match=r"`kv_budget_bytes` must be an integer, got " + re.escape(repr(budget))
    ):
        max_context(spec, 1, budget)


@pytest.mark.parametrize("weight", [True, 2.5, -1, float("nan")])
def test_decode_step_bound_names_a_bad_weight_byte_count(weight):
    from kvlab.plan.roofline import decode_step_bound

    spec = load_spec("llama-3-8b")
    with pytest.raises(
        ValueError,
        match=r"`weight_bytes_read` must be a non-negative integer, got " + re.escape(repr(weight)),
    ):
        decode_step_bound(spec, 1024, 1, weight_bytes_read=weight, bandwidth_bytes_s=1e12)


@pytest.mark.parametrize("model, said", [(None, "NoneType None"), (5, "int 5")])
def test_load_spec_names_a_model_of_another_type(model, said):
    # a TypeError from os.fspath, naming neither the argument nor the value
    with pytest.raises(ValueError, match=re.escape(f"`model` must be a preset name, a path, a hub id, a config dict or a ModelSpec, got {said}")):
        load_spec(model)


@pytest.mark.parametrize("typo, preset", [("llama3-8b", "llama-3-8b"), ("qwen-2.5-7b", "qwen2.5-7b"), ("deepseekv3", "deepseek-v3")])
def test_a_near_miss_of_a_preset_names_it(typo, preset, capsys):
    # `kvlab plan llama3-8b` listed fifteen presets and left the reader to spot the missing hyphen
    for argv in (["plan", typo], ["paging", "static", "--model", typo]):
        assert main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"did you mean {preset}?" in err and "presets: llama-3-8b" in err


def test_a_name_far_from_every_preset_gets_no_guess():
    with pytest.raises(ValueError, match="or a hub id; presets: ") as e:
        load_spec("no-such-model")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("text, exact", [("1e30", 10**30), ("16e9", 16 * 10**9), ("1.5e3", 1500)])
def test_weight_bytes_in_e_notation_is_read_exactly(capsys, text, exact):
    """``--weight-bytes 1e30`` went through a float: 1,000,000,000,000,000,019,884,624,838,656 bytes, a number the
    user did not give (printed in the decode bound's bytes per step)."""
    assert main(["plan", "llama-3-8b", "--weight-bytes", text, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == exact


@pytest.mark.parametrize("command", [["roofline"], ["video"], ["plan", "llama-3-8b"]])
def test_group_size_without_kivi_says_where_mixed_plans_apply(command, capsys):
    # roofline and video read no mixed plan: the refusal no longer offers them one as if they did
    assert main([*command, "--group-size", "64"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--group-size 64 sizes a kivi --kv-dtype (in kvlab plan, also a mixed plan's KIVI layers) only" in err
