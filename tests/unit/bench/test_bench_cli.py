"""`kvlab bench`: records written atomically and never silently replaced, the recorded command, `docs`."""

import contextlib
import io
import json

import pytest
import torch

from kvlab.cli import main
from kvlab.commands import EXIT_FILE_EXISTS
from kvlab.runtime import provenance


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue()


def test_bench_writes_refuses_and_forces(tmp_path):
    argv = [
        "bench",
        "kernel",
        "--quick",
        "--device",
        "cpu",
        "--contexts",
        "160",
        "--q-heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
        "--copy-mib",
        "1",
        "--results-dir",
        str(tmp_path),
        "--json",
    ]
    code, out = _run(argv)
    assert code == 0
    record = json.loads(out)
    path = tmp_path / "kernel-cpu-quick.json"
    assert json.loads(path.read_text()) == record
    assert record["command"] == (
        "kvlab bench kernel --contexts 160 --q-heads 4 --kv-heads 2 --head-dim 64 --copy-mib 1 --quick --device cpu"
    )
    assert record["quick"] is True and record["machine"]["cpu_count"] >= 1
    assert record["result"]["rows"][0]["context"] == 160
    code, _ = _run(argv)
    assert code == EXIT_FILE_EXISTS and json.loads(path.read_text()) == record  # kept
    code, _ = _run(argv + ["--force"])
    assert code == 0 and json.loads(path.read_text())["created_utc"] >= record["created_utc"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_bench_docs_renders_the_records(tmp_path):
    res = tmp_path / "res"
    res.mkdir()  # --out is written only in a folder that exists
    code, _ = _run(
        [
            "bench",
            "flush",
            "--quick",
            "--device",
            "cpu",
            "--caches",
            "kivi4",
            "--kv-heads",
            "2",
            "--head-dim",
            "64",
            "--results-dir",
            str(res),
            "--out",
            str(res / "flush-cpu.json"),
        ]
    )
    assert code == 0
    page = tmp_path / "PERFORMANCE.md"
    code, out = _run(
        ["bench", "docs", "--results-dir", str(res), "--out", str(page), "--json", "--include-quick"]
    )
    assert code == 0
    verdicts = json.loads(out)["targets"]
    assert any(v["file"] == "flush-cpu.json" for v in verdicts)
    text = page.read_text()
    assert "## `flush` on cpu (quick)" in text and "kvlab bench flush" in text


def test_bench_kernel_names_a_bad_setting_before_measuring(tmp_path, monkeypatch, capsys):
    """A zero head count divided by zero, a negative copy size crashed inside torch, and an impossible nbits or
    backend ran every cell to a failed row, exited 0 and saved the record: each is refused up front now."""
    import pytest

    from kvlab.bench import kernel

    monkeypatch.setattr(kernel, "copy_bandwidth", lambda *a, **k: pytest.fail("measured before checking"))
    base = ["bench", "kernel", "--contexts", "256", "--reps", "1", "--results-dir", str(tmp_path)]
    names = {"--nbits": "nbits", "--group-size": "group_size", "--residual-length": "residual_length"}
    for flag, value in [
        ("--kv-heads", "0"),
        ("--q-heads", "0"),
        ("--head-dim", "48"),
        ("--copy-mib", "-1"),
        ("--copy-mib", "0"),
        ("--nbits", "3"),
        ("--group-size", "0"),
        ("--residual-length", "100"),
        ("--backend", "foo"),
    ]:
        assert main([*base, flag, value]) == 2, flag
        err = capsys.readouterr().err
        assert "error:" in err and names.get(flag, flag) in err, (flag, err)
    assert list(tmp_path.iterdir()) == []  # nothing saved


def test_bench_output_paths_are_checked_before_measuring(tmp_path, capsys, monkeypatch):
    """A record path under a file, a folder as --out, and --out/--force with --no-save were tracebacks after the
    run or silently ignored; a folder that refuses the file after the run prints the result and exits 1."""
    from kvlab.bench import paging

    blocker = tmp_path / "precious.json"
    blocker.write_text("{}")
    small = ["bench", "paging", "--sim-requests", "20", "--static-requests", "100"]
    ran = []
    real = paging.run
    monkeypatch.setattr(paging, "run", lambda **kw: ran.append(1) or real(**kw))
    for argv, fragment in [
        ([*small, "--out", str(blocker / "x.json")], "is a file, not a folder"),
        ([*small, "--out", str(tmp_path)], "is a folder; pass a file"),
        ([*small, "--no-save", "--out", str(tmp_path / "r.json")], "--out has no effect with --no-save"),
        ([*small, "--no-save", "--force"], "--force has no effect with --no-save"),
        (
            ["bench", "docs", "--results-dir", str(tmp_path), "--out", str(tmp_path)],
            "is a folder; pass a file",
        ),
    ]:
        assert main(argv) == 2, argv
        assert fragment in capsys.readouterr().err
    assert not ran and blocker.read_text() == "{}"
    monkeypatch.setattr("kvlab.bench.results.atomic_write_json", _refuse)
    assert main([*small, "--out", str(tmp_path / "r.json")]) == 1
    captured = capsys.readouterr()
    assert "could not write the record" in captured.err and "the result follows" in captured.err
    assert "events" in captured.out and ran  # the measurement is shown, not lost


def _refuse(path, *a, **k):
    raise PermissionError(13, "Permission denied", str(path))


def test_a_record_without_its_result_is_named(tmp_path, capsys):
    (tmp_path / "decode-cpu.json").write_text(json.dumps({"format": "kvlab-bench/1", "benchmark": "decode"}))
    argv = [
        "bench",
        "docs",
        "--results-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "P.md"),
        "--include-quick",
    ]
    assert main(argv) == 2
    assert "decode-cpu.json is a kvlab bench record without result, command" in capsys.readouterr().err


def test_quick_refuses_the_sizes_it_would_replace(capsys):
    """--quick replaced --new-tokens/--repeat (lab), --sim-requests (paging), --steps (decode) without a word,
    while the record's command still listed them."""
    for argv, named in [
        (["bench", "lab", "--quick", "--new-tokens", "8", "--repeat", "2"], "--new-tokens, --repeat"),
        (["bench", "paging", "--quick", "--sim-requests", "50"], "--sim-requests"),
        (["bench", "decode", "--quick", "--steps", "8"], "--steps"),
        (["bench", "flush", "--quick", "--hf-reps", "1"], "--hf-reps"),
    ]:
        assert main([*argv, "--no-save"]) == 2
        assert f"--quick sets its own sizes, so {named} would be ignored" in capsys.readouterr().err


def test_lists_refuse_empty_and_repeated_items(capsys):
    """--contexts 64,64 measured the context twice, 256,,512 was accepted, --candidates "" ran the defaults."""
    for argv, fragment in [
        (["bench", "memory", "--contexts", "64,64"], "'64' is given twice"),
        (["bench", "memory", "--contexts", "256,,512"], "empty item in '256,,512'"),
        (["bench", "memory", "--contexts", "256,0"], "'0' in '256,0' is not an integer >= 1"),
        (["bench", "memory", "--candidates", ""], "expected a comma-separated list, got ''"),
        (["bench", "flush", "--caches", "kivi4,kivi4"], "'kivi4' is given twice"),
    ]:
        with pytest.raises(SystemExit) as exit_info:  # an argparse type error
            main([*argv, "--no-save"])
        assert exit_info.value.code == 2
        assert fragment in capsys.readouterr().err
    from kvlab.runtime.checks import int_list

    assert int_list("256, 512") == [256, 512] and int_list("256 512") == [256, 512]


def test_bench_kernel_with_every_row_failed_says_why_and_exits_1(capsys, monkeypatch):
    # a run whose every cell failed is not a measurement: the record says why, and so does the exit status
    from kvlab.bench import kernel

    def broken(*a, **k):
        raise RuntimeError("the kernel broke")

    monkeypatch.setattr(kernel, "_cell", broken)
    argv = ["bench", "kernel", "--quick", "--no-save", "--threads", "1", "--json"]
    assert main(argv) == 1
    assert "every row failed (RuntimeError: the kernel broke)" in capsys.readouterr().err


def test_bench_kernel_backend_triton_where_it_cannot_run_is_refused_before_measuring(capsys):
    # on a CPU without TRITON_INTERPRET=1 (or without Triton) it ran the copy probe, then failed every row (exit 1)
    import torch

    from kvlab.attention.triton_kivi import triton_refusal

    why = triton_refusal(torch.empty(0), 128, 4, 32)
    if why is None:
        pytest.skip("Triton runs here")
    argv = ["bench", "kernel", "--quick", "--no-save", "--backend", "triton", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"`backend` (--backend) 'triton' cannot run --nbits 4: {why}" in err
    assert len(err.strip().splitlines()) == 1 and " tokens" not in err  # no cell started


@pytest.mark.parametrize(
    "argv, said",
    [
        # it said `copy_bytes` (--copy-mib) ... got -1048576: the bytes, not the value given
        (["kernel", "--copy-mib", "-1"], "--copy-mib must be >= 1, got -1"),
        # every row failed on range(0, T, 0) after the model loaded, exit 1
        (["decode", "--prefill-chunk", "0"], "--prefill-chunk must be >= 1, got 0"),
        (["memory", "--prefill-chunk", "-8"], "--prefill-chunk must be >= 1, got -8"),
        # named `n` / `n_requests` by the builders, --sim-requests only after the million-request static run
        (
            ["paging", "--static-requests", "0"],
            "`static_requests` (--static-requests) must be an int >= 1, got 0",
        ),
        (["paging", "--sim-requests", "-1"], "`sim_requests` (--sim-requests) must be an int >= 1, got -1"),
        (["paging", "--rate", "0"], "`rate_per_step` (--rate) must be finite and > 0, got 0.0"),
        # bench memory ran with a negative warm-up and recorded it (bench decode refused it)
        (["memory", "--warmup", "-1"], "`warmup` (--warmup) must be an int >= 0, got -1"),
        # the heads and a cache's own "`setting` (value)" messages named no flag
        (
            ["kernel", "--q-heads", "6", "--kv-heads", "4"],
            "`q_heads` (--q-heads) 6 must be a multiple of `kv_heads` (--kv-heads) 4",
        ),
        (
            ["decode", "--residual-length", "100"],
            "cache 'kivi4-fused': `residual_length` (--residual-length) (100) must be a multiple of `group_size` "
            "(--group-size) (32)",
        ),
    ],
)
def test_bench_sizes_below_one_are_refused_naming_the_value_given(argv, said, capsys):
    assert main(["bench", *argv, "--no-save"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvlab bench {argv[0]}: error: {said}", err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--group-size", "0"], "`group_size` (--group-size) must be an int >= 1, got 0"),
        (["--residual-length", "-1"], "`residual_length` (--residual-length) must be an int >= 0, got -1"),
        (["--caches", "kivi4,kivi-4"], "`caches` (--caches): 'kivi-4' is 'kivi4', given twice"),
        (["--caches", "kivi-4-fused"], "unknown cache 'kivi-4-fused'; expected kivi{2,4,8}"),
        # an empty layer was timed as if it held tokens (exit 0), and R = 0 failed every HQQ/quanto cell (exit 0)
        (["--kv-heads", "0"], "`kv_heads` (--kv-heads) must be an int >= 1, got 0"),
        (["--head-dim", "-1"], "`head_dim` (--head-dim) must be an int >= 1, got -1"),
        (
            ["--residual-length", "0"],
            "`residual_length` (--residual-length) 0 makes hqq4, quanto4 flush on every",
        ),
        # a group that does not divide head_dim failed every KIVI cell after the history was built (exit 0 / 1)
        (["--head-dim", "7"], "cache kivi4 cannot hold `head_dim` (--head-dim) 7: `group_size` (--group-size) (32)"),
    ],
)
def test_bench_flush_errors_name_the_flag_as_eval_does(argv, said, capsys):
    assert main(["bench", "flush", "--quick", "--no-save", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_bench_flush_reads_the_registry_spelling_of_a_cache_name():
    """``kivi-4`` (the registry's name, what eval and plan take) is the benchmark's ``kivi4``; it was refused."""
    from kvlab.bench.flush import run

    result = run(contexts=(64,), caches=("kivi-4", "hqq4"), kv_heads=1, head_dim=32, reps=1, hf_reps=1)
    assert [r["cache"] for r in result["rows"]] == ["kivi4", "hqq4"]
    assert "flush_us" in result["rows"][0]


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (["decode", "--contexts", "99999999"], "`contexts` (--contexts) 99999999"),
        (["memory", "--contexts", "256,99999999"], "`contexts` (--contexts) 99999999"),
        (["decode", "--contexts", "256", "--profile-context", "99999999"], "`profile_context` (--profile-context)"),
    ],
)
def test_bench_refuses_a_context_that_cannot_be_held_before_the_model_loads(argv, setting, capsys, monkeypatch):
    """--contexts 99999999 tiled the prompt to 1e8 tokens and prefilled it: no preflight. Refused now (exit 2),
    naming the flag, the bytes its K/V need and the bytes free, before the model loads."""

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("kvlab.models.load_model", no_load)
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda *a: 8 * 2**30)
    assert main(["bench", *argv, "--device", "cpu", "--no-save"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {setting}" in err and "cannot be held" in err, err
    assert "(their K/V in bfloat16 and the weights), the machine has 8.00 GiB free: at most about" in err, err


def test_bench_room_check_counts_the_kv_of_every_prompt_token(tiny_lm, monkeypatch):
    """The estimate is the K/V of a DynamicCache of the whole prompt: refused just above the free memory, run just
    below; a loaded model's weights are not counted again; past the model's positions only a note."""
    from kvlab.bench.prepare import check_room

    cfg = tiny_lm.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 + 16
    cpu = torch.device("cpu")
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda *a: 1000 * per_token)
    assert check_room(tiny_lm, "bfloat16", cpu, 1000, 990) is None
    with pytest.raises(ValueError, match=r"`contexts` 995 cannot be held: its 1,001 prompt tokens need at least"):
        check_room(tiny_lm, "bfloat16", cpu, 1001, 995)
    with pytest.raises(ValueError, match="in float32\\), the machine has"):  # twice the bytes in float32
        check_room(tiny_lm, "float32", cpu, 600, 590)
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda *a: None)  # unknown: no refusal
    note = check_room(tiny_lm, "bfloat16", cpu, cfg.max_position_embeddings + 1, 5000)
    assert f"pass the model's max_position_embeddings ({cfg.max_position_embeddings:,})" in note


def test_bench_kernel_refuses_a_copy_probe_larger_than_the_memory(capsys, monkeypatch):
    """--copy-mib 1000000 allocated two buffers of ~1 TB and crashed in the allocator (a traceback, exit 1)."""

    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 8 * 2**30)
    assert main(["bench", "kernel", "--no-save", "--contexts", "512", "--copy-mib", "8192"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlab bench kernel: error: --copy-mib 8,192 (two buffers) needs about 16.00 GiB"), err


def test_bench_names_a_damaged_model_folder_by_its_flag(tmp_path, capsys):
    """A folder whose weights transformers cannot read: one error line naming --model (it named no flag)."""
    import shutil

    from kvlab.models import reference_model_path

    folder = tmp_path / "damaged"
    shutil.copytree(reference_model_path(), folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    argv = ["bench", "decode", "--quick", "--no-save", "--model", str(folder), "--contexts", "64"]
    assert main([*argv, "--candidates", "dynamic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"kvlab bench decode: error: --model {folder}: its config.json or weights"), err


@pytest.mark.parametrize("flag", ["--static-requests", "--sim-requests"])
def test_bench_paging_refuses_a_request_count_beyond_the_memory(flag, capsys, monkeypatch):
    """A billion requests filled the memory with no output (the static run reached 17 GB in 15 s)."""

    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 2**30)
    other = "--sim-requests" if flag == "--static-requests" else "--static-requests"
    assert main(["bench", "paging", "--no-save", flag, "999999999", other, "10"]) == 2
    err = capsys.readouterr().err.strip()
    dest = flag[2:].replace("-", "_")
    assert err.startswith(f"kvlab bench paging: error: `{dest}` ({flag}) 999,999,999 needs about"), err
    assert err.endswith("the machine has 1.00 GiB available; give fewer requests"), err
