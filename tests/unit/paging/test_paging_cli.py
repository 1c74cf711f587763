"""``kvlab paging``: static JSON under the mechanics chapter's keys, simulate JSON, the figure."""

import json

import pytest

from kvlab.cli import main


def run_json(capsys, *argv):
    assert main(["paging", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_static_json_has_the_seeds_keys_and_figures(capsys):
    out = run_json(capsys, "static", "--gpu-mem-gib", "80")  # the mechanics chapter's 80 GiB device
    assert out["A"]["uniform"]["k_cont"] == 122
    assert out["A"]["uniform"]["k_paged"] == 214
    assert out["A"]["heavy"]["k_paged"] == 405
    assert f"{out['B']['ratio']:.1f}" == "239.0"
    assert [r["bs"] for r in out["C"]["rows"]] == [1, 4, 8, 16, 32, 64, 128, 256]


def test_static_defaults_reproduce_the_mechanics_chapter(capsys):
    # no flags: the default A100-80GB holds 81,920 MiB = 80 GiB as the device reports it, the chapter's budget
    # (its datasheet's 80e9 B gave 111 / 194 / 366)
    out = run_json(capsys, "static")
    assert out["config"]["gpu_bytes"] == 80 * 1024**3
    counts = (out["A"]["uniform"]["k_cont"], out["A"]["uniform"]["k_paged"], out["A"]["heavy"]["k_paged"])
    assert counts == (122, 214, 405) and out["A"]["heavy"]["k_cont"] == 122
    assert f"{out['B']['ratio']:.1f}" == "239.0"
    assert main(["paging", "static"]) == 0
    text = capsys.readouterr().out
    assert all(n in text for n in ("122", "214", "405", "239.0x"))


def test_static_one_workload_and_a_file(capsys, tmp_path):
    out = run_json(capsys, "static", "--workload", "heavy", "--block-size", "32")
    assert set(k for k, v in out["A"].items() if isinstance(v, dict)) == {"heavy"}
    assert out["config"]["block_size"] == 32 and out["B"]["block_size"] == 32
    lengths = tmp_path / "lens.txt"
    lengths.write_text("\n".join(["4096"] * 10 + ["100"] * 10))
    out = run_json(capsys, "static", "--workload", str(lengths))
    assert out["A"]["file"]["k_cont"] == 20 and out["A"]["file"]["util_cont"] == pytest.approx(
        (10 * 4096 + 10 * 100) / (20 * 4096)
    )


def test_static_kv_dtype_changes_bytes_per_token(capsys):
    bf16 = run_json(capsys, "static", "--workload", "uniform")
    out = run_json(capsys, "static", "--workload", "uniform", "--kv-dtype", "kivi4")
    assert out["config"]["kv_bytes_per_token"] == 40960
    assert out["config"]["gpu_bytes"] == bf16["config"]["gpu_bytes"]
    # 3.2x fewer bytes per token, less each request's residual window of 128 tokens at bf16 (it was not charged,
    # and KIVI-4 admitted more than 3x as many)
    assert 2.5 * bf16["A"]["uniform"]["k_paged"] < out["A"]["uniform"]["k_paged"] < 3 * bf16["A"]["uniform"]["k_paged"]
    assert out["config"]["residual_window"] == {
        "residual_length": 128, "group_size": 32, "bytes_per_token": 131072, "dtype": "bf16"
    }  # fmt: skip
    assert bf16["config"]["residual_window"] is None


@pytest.mark.parametrize("argv", [[], ["--model", "llama-3-8b"], ["--kv-dtype", "kivi4"]])
def test_default_device_memory_is_the_planners_gpu(capsys, argv):
    """Without --gpu-mem-gib, paging's device is kvlab plan's default GPU, as the device reports its memory."""
    from kvlab.plan.hardware import get_hardware
    from kvlab.plan.scenario import DEFAULT_GPU

    hw = get_hardware(DEFAULT_GPU)
    out = run_json(capsys, "static", "--workload", "uniform", *argv)
    assert out["config"]["gpu_bytes"] == hw.memory_bytes
    assert f"{hw.name} {hw.memory_mib:,} MiB" in out["config"]["source"]
    plan = json.loads(_stdout(capsys, ["plan", "llama-3-8b", "--json"]))
    assert plan["budget"]["memory_bytes"] == out["config"]["gpu_bytes"]
    explicit = run_json(capsys, "static", "--workload", "uniform", "--gpu-mem-gib", "80", *argv)
    assert explicit["config"]["gpu_bytes"] == 80 * 1024**3 and "80 GiB" in explicit["config"]["source"]


def test_budget_help_states_units_and_default(capsys):
    with pytest.raises(SystemExit):
        main(["paging", "static", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "GiB (2^30 B)" in text and "81,920 MiB = 80.00 GiB" in text and "A100-80GB" in text


def _stdout(capsys, argv):
    assert main(argv) == 0
    return capsys.readouterr().out


def test_bad_workload_exits_with_a_message(capsys):
    assert main(["paging", "static", "--workload", "no/such/file"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--workload" in err


def test_simulate_json(capsys, tmp_path):
    out = run_json(
        capsys,
        "simulate",
        "--requests", "40",
        "--rate", "1",
        "--prompt-tokens", "64:512",
        "--output-tokens", "16:128",
        "--prefix-groups", "2",
        "--prefix-tokens", "128",
        "--gpu-mem-gib", "19.3",
        "--max-len", "1024",
        "--check-every", "1",
        "--save-trace", str(tmp_path / "t.csv"),
    )  # fmt: skip
    assert list(out["policies"]) == ["contiguous", "paged", "paged+prefix", "paged+kivi4"]
    for res in out["policies"].values():
        assert res["finished"] == 40 and res["conservation"]["all_freed"]
    out2 = run_json(
        capsys,
        "simulate",
        "--trace",
        str(tmp_path / "t.csv"),
        "--policies",
        "paged,paged+prefix",
        "--gpu-mem-gib",
        "19.3",
        "--max-len",
        "1024",
    )
    assert list(out2["policies"]) == ["paged", "paged+prefix"]
    assert out2["policies"]["paged"]["steps"] == out["policies"]["paged"]["steps"]


def test_figure_is_written_once(capsys, tmp_path):
    path = tmp_path / "fig_paged.png"
    assert main(["paging", "figure", "--out", str(path)]) == 0
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
    assert main(["paging", "figure", "--out", str(path)]) == 2
    assert "--force" in capsys.readouterr().err


def test_model_and_kv_dtype_come_from_the_planner(capsys):
    out = run_json(capsys, "static", "--model", "llama-3-8b", "--gpu-mem-gib", "80")
    assert out["config"]["kv_bytes_per_token"] == 131072 and out["config"]["source"].startswith("kvlab.plan")
    assert (out["A"]["uniform"]["k_cont"], out["A"]["uniform"]["k_paged"], out["A"]["heavy"]["k_paged"]) == (
        122,
        214,
        405,
    )
    out = run_json(capsys, "static", "--model", "llama-3-8b", "--kv-dtype", "kivi4", "--workload", "heavy")
    assert out["config"]["kv_bytes_per_token"] == 40960  # 1280 B per 2048 K+V elements
    assert main(["paging", "static", "--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err


def test_simulate_prints_one_progress_line_per_policy_on_stderr(capsys, tmp_path):
    shape = ["--gpu-mem-gib", "40", "--max-len", "2048"]
    poisson = ["--requests", "20", "--prompt-tokens", "64:512", "--output-tokens", "16:128"]
    trace = str(tmp_path / "t.csv")
    assert main(["paging", "simulate", *poisson, *shape, "--save-trace", trace, "--json"]) == 0
    capsys.readouterr()
    # the Poisson flags are not repeated: with --trace they are refused, not ignored
    assert (
        main(["paging", "simulate", "--trace", trace, *shape, "--policies", "paged,contiguous", "--json"])
        == 0
    )
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("[")]
    steps = [line.split("s  ", 1)[1] for line in lines]
    assert steps == ["policy paged: 20 requests", "policy contiguous: 20 requests"]
    assert lines[0].startswith("[1/2]") and lines[1].startswith("[2/2]")
    assert json.loads(captured.out)["policies"]  # stdout stays pure JSON
