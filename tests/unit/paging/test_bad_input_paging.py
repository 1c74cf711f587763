"""Hostile input to ``kvlab paging`` and :mod:`kvlab.paging`: bad values get ``error: ...`` naming them and exit
status 2 (the library: a ``ValueError``); nothing hangs, crashes inside numpy or is silently accepted."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.paging import BlockPool
from kvlab.paging.budget import GIB, KVBudget
from kvlab.paging.simulate import simulate
from kvlab.paging.static import load_lengths, workload
from kvlab.paging.trace import Trace, load_trace, poisson_trace

HEADER = "arrival_step,prompt_tokens,output_tokens\n"
SMALL = ["--requests", "5", "--prompt-tokens", "16:32", "--output-tokens", "4:8"]


def fails(capsys, argv, *fragments):
    assert main(["paging", *argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    for fragment in fragments:
        assert fragment in err, err


def trace_file(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["simulate", *SMALL, "--max-running", "0"], ("--max-running", "0")),  # used to loop forever
        (["simulate", *SMALL, "--max-running", "-1"], ("--max-running", "-1")),
        (["simulate", *SMALL, "--check-every", "-1"], ("--check-every", "-1")),
        (["simulate", *SMALL, "--max-len", "0"], ("--max-len", "0")),
        (["simulate", *SMALL, "--rate", "inf"], ("--rate", "inf")),
        (["simulate", *SMALL, "--policies", ",,,"], ("policies",)),
        (["simulate", *SMALL, "--gpu-mem-gib", "inf"], ("--gpu-mem-gib", "inf")),
        (["simulate", *SMALL, "--gpu-mem-gib", "nan"], ("--gpu-mem-gib", "nan")),
        (["simulate", "--trace", "/no/such/trace.csv"], ("/no/such/trace.csv",)),
        (["static", "--max-len", "0"], ("--max-len", "0")),
        (["static", "--max-len", "1024", "--workload", "heavy"], ("--max-len", "1024", "heavy")),
        (["static", "--gpu-mem-gib", "inf"], ("--gpu-mem-gib", "inf")),
        (["static", "--block-size", "0"], ("--block-size", "0")),
        (["figure", "--out", "/no/such/dir/fig"], ("suffix",)),
    ],
)
def test_cli_bad_values_are_named(capsys, argv, fragments):
    fails(capsys, argv, *fragments)


def test_save_trace_into_a_missing_directory_is_an_error_not_a_traceback(capsys, tmp_path):
    fails(
        capsys,
        ["simulate", *SMALL, "--save-trace", str(tmp_path / "no" / "dir" / "t.csv")],
        "--save-trace",
        "folder",
    )
    assert not (tmp_path / "no").exists()


def test_trace_is_a_directory(capsys, tmp_path):
    fails(capsys, ["simulate", "--trace", str(tmp_path)], str(tmp_path))


@pytest.mark.parametrize(
    "body, fragments",
    [
        (HEADER + "0,10\n", ("line 2", "3")),  # a field short
        (HEADER + "0,10,10,5,5,5\n", ("line 2", "3")),  # fields beyond the header
        (HEADER + "0,10.5,10\n", ("line 2", "prompt_tokens", "10.5")),
        (HEADER + "nan,10,10\n", ("arrival_step", "finite")),
        (HEADER + "inf,10,10\n", ("arrival_step", "finite")),
    ],
)
def test_malformed_trace_rows_are_named(tmp_path, body, fragments):
    with pytest.raises(ValueError) as info:
        load_trace(trace_file(tmp_path, body))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_undecodable_files_name_the_path(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="bin.csv"):
        load_trace(path)
    with pytest.raises(ValueError, match="bin.csv"):
        load_lengths(path)


def test_lengths_from_a_trace_reject_negative_parts(tmp_path):
    path = trace_file(tmp_path, HEADER + "0,-5,10\n")  # -5 + 10 = 5 would pass as a length
    with pytest.raises(ValueError, match="prompt_tokens"):
        load_lengths(path)
    path = trace_file(tmp_path, "tokens\n5.5\n", "f.csv")
    with pytest.raises(ValueError, match="f.csv"):
        load_lengths(path)


def test_library_checks():
    with pytest.raises(ValueError, match="arrival_step"):
        Trace(np.array([math.nan]), np.array([10]), np.array([10]), np.array([-1]), np.array([0]))
    with pytest.raises(ValueError, match="rate_per_step"):
        poisson_trace(5, math.inf)
    trace = poisson_trace(5, 1.0, (16, 32), (4, 8))
    with pytest.raises(ValueError, match="max_running"):
        simulate(trace, max_running=0)
    with pytest.raises(ValueError, match="policies"):
        simulate(trace, policies=[])
    with pytest.raises(ValueError, match="max_len"):
        workload("uniform", 10, 0, max_len=256)
    with pytest.raises(ValueError, match="gpu_bytes"):
        KVBudget(math.inf, 0.0, 0.0, 2.0)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        KVBudget(80 * GIB, 0.0, 0.0, math.inf)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["static", "--gpu-mem-gib", "-1"], ("--gpu-mem-gib", "-1")),
        (["static", "--gpu-mem-gib", "0"], ("--gpu-mem-gib", "0")),
        (["static", "--gpu-mem-gib", "nan"], ("--gpu-mem-gib", "nan")),
        (["simulate", *SMALL, "--reserve-gib", "-2"], ("--reserve-gib", "-2")),
    ],
)
def test_device_memory_and_reserve_flags_are_named(capsys, argv, fragments):
    fails(capsys, argv, *fragments)


@pytest.mark.parametrize(
    "value, fragment",
    [("fp8-e4m4", "'fp8-e4m4'"), ("kivi-4:group_size=0", "got 0"), ("kivi-k3v4", "got 3")],
)
def test_a_bad_quant_kv_dtype_names_its_own_flag(capsys, value, fragment):
    # the planner's message named `kv_dtype`: the user's --kv-dtype (bf16) was fine, --quant-kv-dtype was not
    fails(capsys, ["simulate", *SMALL, "--quant-kv-dtype", value], "--quant-kv-dtype", fragment)


@pytest.mark.parametrize(
    "argv, flag, value",
    [
        (["simulate", *SMALL, "--rate", "0"], "--rate", "0"),
        (["simulate", "--requests", "0"], "--requests", "0"),
        (["simulate", *SMALL, "--prompt-tokens", "64:16"], "--prompt-tokens", "(64, 16)"),
        (["simulate", *SMALL, "--output-tokens", "0:0"], "--output-tokens", "(0, 0)"),
        (["simulate", *SMALL, "--prefix-groups", "-1"], "--prefix-groups", "-1"),
        (["simulate", *SMALL, "--max-running", "0"], "--max-running", "0"),
        (["simulate", *SMALL, "--block-size", "0"], "--block-size", "0"),
        (["static", "--block-size", "0"], "--block-size", "0"),
        (
            ["simulate", *SMALL, "--kv-dtype", "kivi-4:residual_length=-32"],
            "--kv-dtype",
            "residual_length=-32",
        ),
        (["simulate", *SMALL, "--kv-dtype", "kivi-4:group_size=0"], "--kv-dtype", "got 0"),
        (["simulate", *SMALL, "--kv-dtype", "kivi-4:group_size=3"], "--kv-dtype", "(3)"),
        (["static", "--kv-dtype", "fp8-e4m4"], "--kv-dtype", "'fp8-e4m4'"),
    ],
)
def test_simulate_and_static_errors_name_the_flag(capsys, argv, flag, value):
    """The library names its arguments (`rate_per_step`, `kv_dtype`); the user typed a flag."""
    assert main(["paging", *argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and flag in err and value in err, err
    for name in ("`rate_per_step`", "`n_requests`", "`block_size_tokens`", "`kv_dtype`", "`max_running`"):
        assert name not in err, err


def test_trace_file_columns_keep_their_csv_names(capsys, tmp_path):
    # `prompt_tokens` in a trace row is the CSV column, not --prompt-tokens
    path = trace_file(tmp_path, HEADER + "0,abc,3\n")
    fails(capsys, ["simulate", "--trace", path], "line 2", "`prompt_tokens`", "'abc'")


@pytest.mark.parametrize("policies", ["contiguous", "paged,paged+prefix"])
def test_keep_tokens_left_out_of_the_policies_is_refused_not_ignored(capsys, policies):
    fails(
        capsys,
        ["simulate", *SMALL, "--keep-tokens", "8", "--policies", policies],
        "--keep-tokens 8",
        "paged+keep8",
    )


@pytest.mark.parametrize("extra", [[], ["--keep-tokens", "17"]])
def test_a_keep_policy_without_its_keep_tokens_says_which_flag_it_needs(capsys, extra):
    fails(
        capsys, ["simulate", *SMALL, *extra, "--policies", "paged+keep16"], "paged+keep16", "--keep-tokens 16"
    )


def test_a_bad_kv_dtype_setting_is_named_once(capsys):
    assert main(["paging", "simulate", *SMALL, "--quant-kv-dtype", "kivi-4:foo=1"]) == 2
    err = capsys.readouterr().err
    assert "--quant-kv-dtype 'kivi-4:foo=1'" in err and "['foo']" in err and err.count("kivi-4:foo=1") == 1, (
        err
    )


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["simulate", *SMALL, "--trace", ""], "--trace"),  # was: a Poisson trace generated instead
        (["simulate", *SMALL, "--save-trace", ""], "--save-trace"),  # was: nothing saved, no word
        (["figure", "--out", ""], "--out"),  # was: "error:  already exists" (the current folder)
    ],
)
def test_an_empty_path_is_refused_naming_its_flag(capsys, argv, flag):
    fails(capsys, argv, f"{flag} must name a file, got ''")


def test_keep_tokens_not_below_the_longest_request_is_refused(capsys, tmp_path):
    # every request of the trace fits under the cap: paged+keepN evicted nothing and equalled paged
    path = trace_file(tmp_path, HEADER + "0,20,10\n1,30,5\n")  # the longest request holds 35 tokens
    fails(
        capsys, ["simulate", "--trace", path, "--keep-tokens", "35"], "--keep-tokens 35", "35 tokens", "evict"
    )
    assert (
        main(["paging", "simulate", "--trace", path, "--keep-tokens", "34", "--policies", "paged+keep34"])
        == 0
    )


HUGE = str(10**30)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["static", "--block-size", HUGE], "--block-size"),  # was OverflowError: Python int too large ...
        (["static", "--max-len", HUGE], "--max-len"),  # was numpy's "high is out of bounds for int64"
        (["simulate", *SMALL, "--prefix-tokens", HUGE], "--prefix-tokens"),  # was OverflowError
        (["simulate", "--requests", "3", "--prompt-tokens", f"16:{HUGE}"], "--prompt-tokens"),
        (["simulate", *SMALL, "--max-running", HUGE], "--max-running"),
        (["figure", "--out", "f.png", "--block-size", HUGE], "--block-size"),
    ],
)
def test_an_integer_past_int64_is_refused_by_its_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        main(["paging", *argv])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"argument {flag}" in err and "2**62" in err, err


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_figure_out_that_is_a_folder_is_refused_even_with_force(capsys, tmp_path, force):
    # was "<folder> already exists; pass --force to replace it"
    fails(capsys, ["figure", "--out", str(tmp_path), *force], "--out", str(tmp_path), "folder")
    assert tmp_path.is_dir()


def test_figure_out_under_a_file_names_the_file(capsys, tmp_path):
    # was a bare "[Errno 17] File exists: '<file>'"
    afile = tmp_path / "file.json"
    afile.write_text("{}")
    fails(capsys, ["figure", "--out", str(afile / "f.png")], "--out", str(afile), "is a file, not a folder")
    assert afile.read_text() == "{}"


@pytest.mark.parametrize("late", ["1e20", "9007199254740993", "9007199254740992", "1e300"])
def test_an_arrival_past_2_53_steps_is_refused_naming_its_row(capsys, tmp_path, late):
    # 1e20 overflowed int64 in ceil(arrival): the run reported makespan_steps 20, as if it had arrived at step 0
    path = trace_file(tmp_path, HEADER + f"0,100,20\n{late},100,20\n")
    fails(capsys, ["simulate", "--trace", path], "line 3", "`arrival_step`", repr(late), "2**53")
    with pytest.raises(ValueError, match="request 1: `arrival_step`"):
        Trace(*(np.array(c) for c in ([0.0, float(late)], [100, 100], [20, 20], [-1, -1], [0, 0])))


def test_an_arrival_just_below_2_53_steps_still_runs(capsys, tmp_path):
    path = trace_file(tmp_path, HEADER + f"0,100,20\n{2**53 - 1},100,20\n")
    assert main(["paging", "simulate", "--trace", path, "--policies", "paged", "--json"]) == 0
    assert f'"makespan_steps": {2**53 - 1 + 20}' in capsys.readouterr().out


@pytest.mark.parametrize("rate", ["1e-300", "1e-14", "5e-324"])
def test_a_rate_whose_arrivals_pass_2_53_steps_is_refused_by_flag(capsys, rate):
    # --rate 1e-300 reported last_arrival_step 2.27e300 and a makespan of ~1,000 steps
    fails(capsys, ["simulate", "--rate", rate, "--requests", "500"], f"--rate {rate} is too low", "2**53")
    with pytest.raises(ValueError, match="`rate_per_step`"):
        poisson_trace(500, float(rate))


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["static", "--seed", "-1"], ("--seed", "got -1")),  # was numpy's "expected non-negative integer"
        (["simulate", *SMALL[2:], "--requests", "5", "--seed", "-1"], ("--seed", "got -1")),
        (["static", "--requests", "0"], ("--requests", "got 0")),  # was "`n` must be >= 1"
        # --prefix-tokens was dropped without a word when --prefix-groups was 0
        (["simulate", *SMALL, "--prefix-groups", "0", "--prefix-tokens", "100"], ("--prefix-tokens 100",)),
        (["simulate", *SMALL, "--prefix-tokens", "0"], ("--prefix-groups", "--prefix-tokens")),
        # '' ran every policy; an empty item was dropped
        (["simulate", *SMALL, "--policies", ""], ("--policies", "expected a comma-separated list, got ''")),
        (["simulate", *SMALL, "--policies", "paged,,contiguous"], ("--policies", "empty item")),
    ],
)
def test_seed_requests_prefix_and_policies_are_named(capsys, argv, fragments):
    fails(capsys, argv, *fragments)
    for name in ("`n`", "`seed`", "`n_requests`", "non-negative integer"):
        assert name not in capsys.readouterr().err


def test_library_seed_and_request_count_are_named():
    with pytest.raises(ValueError, match="`seed` must be an int >= 0, got -1"):
        workload("uniform", 10, seed=-1)
    with pytest.raises(ValueError, match="`seed`"):
        poisson_trace(5, 1.0, seed=-1)


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--rate", "5"], ("--rate 5", "--trace")),  # was silently ignored
        (["--requests", "9", "--prompt-tokens", "8:9"], ("--requests 9", "--prompt-tokens 8:9", "--trace")),
        (["--save-trace", "out.csv"], ("--save-trace out.csv",)),
    ],
)
def test_poisson_flags_with_a_trace_are_refused_not_ignored(capsys, tmp_path, extra, fragments):
    path = trace_file(tmp_path, HEADER + "0,20,10\n1,30,5\n")
    fails(capsys, ["simulate", "--trace", path, *extra], *fragments)


def test_prefix_groups_zero_alone_still_means_no_prefix(capsys):
    assert main(["paging", "simulate", *SMALL, "--prefix-groups", "0", "--policies", "paged", "--json"]) == 0
    assert '"prefix_requests": 0' in capsys.readouterr().out


def test_series_without_json_is_refused_not_ignored(capsys):
    fails(capsys, ["simulate", *SMALL, "--series"], "--series", "--json")
    assert main(["paging", "simulate", *SMALL, "--series", "--json", "--policies", "paged"]) == 0


@pytest.mark.parametrize(
    "body, line, text",
    [
        ("100\nnan\n200\n", 2, "'nan'"),
        ("100\n\n2.5\n", 3, "'2.5'"),  # blank lines keep their number
        ("nan\n100\n", 1, "'nan'"),
        ("100\n-3\n", 2, "'-3'"),
    ],
)
def test_a_bad_line_of_a_lengths_file_is_named(capsys, tmp_path, body, line, text):
    # was: "got columns ['100']" (the first line read as a CSV header)
    path = trace_file(tmp_path, body, "lens.txt")
    fails(capsys, ["static", "--workload", path], f"lens.txt: line {line}", text)
    assert "columns" not in capsys.readouterr().err


def test_save_trace_under_a_file_says_it_is_a_file(capsys, tmp_path):
    afile = tmp_path / "ok.txt"
    afile.write_text("x")
    fails(
        capsys,
        ["simulate", *SMALL, "--save-trace", str(afile / "x.csv")],
        "--save-trace",
        f"{afile} is a file, not a folder",
    )


def test_figure_into_a_missing_folder_is_refused_as_save_trace(capsys, tmp_path):
    out = tmp_path / "no" / "dir" / "x.png"
    fails(capsys, ["figure", "--out", str(out)], "--out", f"folder {out.parent} does not exist")
    assert not (tmp_path / "no").exists()  # was: created


def test_figure_library_refuses_a_missing_folder(tmp_path):
    from kvlab.paging.figure import plot_paged_layout

    with pytest.raises(ValueError, match="does not exist"):
        plot_paged_layout({}, tmp_path / "no" / "x.png")
    assert not (tmp_path / "no").exists()


def test_a_trace_column_named_twice_is_refused(capsys, tmp_path):
    # was: csv.DictReader silently kept the last `arrival_step`
    path = trace_file(tmp_path, "arrival_step,prompt_tokens,output_tokens,arrival_step\n0,100,10,5\n")
    fails(capsys, ["simulate", "--trace", path], "`arrival_step` 2 times", "columns 1, 4")


def test_a_prefix_group_with_two_lengths_is_refused_naming_both_rows(capsys, tmp_path):
    header = "arrival_step,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n"
    path = trace_file(tmp_path, header + "0,100,10,1,50\n1,100,10,2,20\n2,100,10,1,60\n")
    fails(capsys, ["simulate", "--trace", path], "lines 2 and 4", "`prefix_group` 1", "50 and 60")
    same = trace_file(tmp_path, header + "0,100,10,1,50\n1,100,10,2,20\n2,100,10,1,50\n", "same.csv")
    assert len(load_trace(same)) == 3


def test_block_pool_refuses_foreign_blocks_and_double_frees():
    """A block of another pool once entered this pool's free queue (a 4-block pool then handed out 5); a double
    free was a bare assert (gone under python -O). Both are ValueErrors now, and nothing is changed."""
    pool, other = BlockPool(4, 16), BlockPool(4, 16)
    foreign = other.allocate(1)
    with pytest.raises(ValueError, match="block 0 is not a block of this pool"):
        pool.free(foreign)
    with pytest.raises(ValueError, match="not a block of this pool"):
        pool.touch(foreign)
    assert pool.num_free == 4 and len(pool.allocate(4)) == 4
    with pytest.raises(ValueError, match="need 1 block, 0 free"):
        pool.allocate(1)
    pool = BlockPool(4, 16)
    (block,) = pool.allocate(1)
    with pytest.raises(ValueError, match="double free of block 0: 1 holder"):
        pool.free([block, block])
    assert block.ref_cnt == 1 and pool.num_free == 3  # the refused call freed nothing
    pool.free([block])
    with pytest.raises(ValueError, match="double free of block 0: 0 holder"):
        pool.free([block])
    with pytest.raises(ValueError, match="copy-on-write of unshared block"):
        pool.copy_on_write(pool.allocate(1)[0], 0)
    pool.check_invariants()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: BlockPool(True, 16), "num_blocks"),
        (lambda: BlockPool(4, 2.5), "block_size_tokens"),
        (lambda: BlockPool(4, 16).allocate(-1), "`n`"),
        (lambda: BlockPool(4, 16).add_blocks(1.5), "`n`"),
    ],
)
def test_block_pool_sizes_are_integers(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_a_missing_trace_file_names_it_and_the_way_to_write_one(capsys, tmp_path):
    fails(capsys, ["simulate", "--trace", str(tmp_path / "t.csv")], "no such file", "--save-trace")


@pytest.mark.parametrize(
    "where, said",
    [
        ("/dev/urandom", "--trace /dev/urandom: a character device, not a regular file; pass a trace CSV"),
        ("/dev/null", "--trace /dev/null: a character device, not a regular file; pass a trace CSV"),
        ("folder", "a folder; pass a trace CSV"),
        ("missing/t.csv", "no such file (folder "),
        ("link", "a broken link; pass a trace CSV"),
        ("binary.csv", "not a text file"),
    ],
)
def test_a_trace_that_is_no_csv_says_what_it_is_without_suggesting_to_write_there(capsys, tmp_path, where, said):
    """`--trace /dev/urandom` suggested "write one with `kvlab paging simulate --save-trace /dev/urandom`": writing a
    trace is suggested only where nothing stands at the path (and its folder exists)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "gone.csv")
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)))
    path = where if where.startswith("/") else str(tmp_path / where)
    fails(capsys, ["simulate", "--trace", path], said)
    assert main(["paging", "simulate", "--trace", path]) == 2
    assert "--save-trace" not in capsys.readouterr().err


def test_quant_kv_dtype_without_its_policy_is_refused(capsys):
    """--policies paged with --quant-kv-dtype kivi-2 ran paged alone and dropped the flag without a word."""
    fails(capsys, ["simulate", *SMALL, "--quant-kv-dtype", "kivi-2", "--policies", "paged"], "paged+kivi-2")
    assert (
        main(["paging", "simulate", *SMALL, "--quant-kv-dtype", "kivi-2", "--policies", "paged,paged+kivi-2"])
        == 0
    )


def test_run_settings_are_refused_before_any_policy_runs(tmp_path, capsys):
    """--max-running 0 was refused only after the first policy had run (its progress line printed) and after
    --save-trace had written the trace; the library checked it per policy."""
    trace = poisson_trace(5, 1.0, (16, 32), (4, 8))
    started = []
    with pytest.raises(ValueError, match="max_running"):
        simulate(trace, max_running=0, progress=started.append)
    assert started == []
    saved = tmp_path / "trace.csv"
    fails(capsys, ["simulate", *SMALL, "--max-running", "0", "--save-trace", str(saved)], "--max-running")
    assert not saved.exists()
    fails(capsys, ["simulate", *SMALL, "--check-every", "-1"], "--check-every must be an int >= 0, got -1")


@pytest.mark.parametrize(
    "argv, need",
    [
        (["static", "--requests", "999999999"], "89.41 GiB"),
        (["static", "--workload", "heavy", "--requests", "999999999"], "44.70 GiB"),
        (["simulate", "--requests", "999999999"], "7629.39 GiB"),
    ],
)
def test_a_request_count_past_the_memory_is_refused_before_anything_is_made(capsys, monkeypatch, argv, need):
    # --requests 999999999 reached 15-17 GB resident in 15 s with no output; now an estimate refuses it up front
    import kvlab.paging.static
    import kvlab.paging.trace
    import kvlab.runtime.provenance

    def never(*args, **kwargs):
        raise AssertionError("the workload was made before the memory check")

    monkeypatch.setattr(kvlab.runtime.provenance, "available_memory_bytes", lambda: 8 * GIB)
    monkeypatch.setattr(kvlab.paging.static, "run_static", never)
    monkeypatch.setattr(kvlab.paging.trace, "poisson_trace", never)
    fails(capsys, argv, "--requests 999,999,999", f"needs about {need}", "8.00 GiB available")


def test_the_default_request_counts_pass_the_memory_check(monkeypatch):
    import kvlab.lab.longrun

    monkeypatch.setattr(kvlab.runtime.provenance, "available_memory_bytes", lambda: GIB)
    assert main(["paging", "static", "--json", "--requests", "400"]) == 0
    assert main(["paging", "simulate", "--json", *SMALL]) == 0


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_trace_file_is_named_with_its_flag(capsys, tmp_path, text):
    # was: "error: I/O operation on closed file." (the header was read lazily after the file closed)
    path = trace_file(tmp_path, text)
    fails(capsys, ["simulate", "--trace", path], f"--trace {path}: empty file", "arrival_step")
    with pytest.raises(ValueError, match="empty file"):
        load_trace(path)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--prefix-tokens", "4000"], ("exceeds --max-len 4,096", "--prefix-tokens 4,000", "--prompt-tokens")),
        (["--max-len", "100"], ("exceeds --max-len 100", "--output-tokens")),
        (["--gpu-mem-gib", "19"], ("the pool has 0", "--gpu-mem-gib 19", "--reserve-gib 4", "--max-len")),
    ],
)
def test_a_request_that_cannot_fit_is_refused_before_the_first_policy_runs(capsys, tmp_path, extra, said):
    # was: "[1/4] policy contiguous" began, then "... exceeds max_len 4096" / "the pool has 0", no flag named
    saved = tmp_path / "t.csv"
    assert main(["paging", "simulate", "--requests", "50", "--save-trace", str(saved), *extra]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said) and "[1/" not in err and not saved.exists(), err


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--requests", "7", "--seed", "3"], "--requests 7, --seed 3: flags of the built-in workloads, which"),
        (["--seed", "3"], "--seed 3: a flag of the built-in workloads, which"),
    ],
)
def test_static_refuses_workload_flags_a_workload_file_fixes(capsys, tmp_path, flags, said):
    # they were silently ignored: the file fixes the requests (paging simulate --trace refused the same)
    lengths = trace_file(tmp_path, "100\n200\n300\n", "lengths.txt")
    fails(capsys, ["static", "--workload", lengths, *flags], said, f"--workload {lengths} replaces; drop")
    assert main(["paging", "static", "--workload", lengths, "--json"]) == 0


@pytest.mark.parametrize("command", [["static"], ["simulate", *SMALL]])
def test_a_block_larger_than_the_reservation_is_refused(capsys, command):
    # paging static reported 5 requests and 12 GiB of last-block waste per request, silently
    fails(
        capsys,
        [*command, "--block-size", "100000"],
        "--block-size 100,000 is larger than --max-len 4,096 (the contiguous reservation per request)",
    )


def test_save_trace_onto_an_existing_file_needs_force(capsys, tmp_path):
    # it failed "t.csv exists; not overwriting" and simulate had no --force (figure and report have one)
    saved = tmp_path / "t.csv"
    argv = ["paging", "simulate", *SMALL, "--save-trace", str(saved), "--json"]
    assert main(argv) == 0
    first = saved.read_text()
    capsys.readouterr()
    fails(capsys, ["simulate", *SMALL, "--seed", "1", "--save-trace", str(saved)], f"{saved} already exists; pass --force")
    assert saved.read_text() == first
    assert main([*argv, "--seed", "1", "--force"]) == 0
    assert saved.read_text() != first
    fails(capsys, ["simulate", *SMALL, "--force"], "--force replaces an existing --save-trace file; pass --save-trace")
