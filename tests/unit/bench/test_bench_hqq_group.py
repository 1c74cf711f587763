"""kvlab bench refuses an HQQ/quanto group size up front: one that does not fit the layer (as kvlab eval does), and
one no cache of the run takes."""

import pytest

from kvlab.bench import flush
from kvlab.cli import main


@pytest.fixture
def no_run(monkeypatch):
    def refuse(**kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(flush, "_measure", lambda *a, **k: refuse())


def test_a_group_size_that_does_not_divide_a_token_is_refused(capsys, no_run):
    code = main(["bench", "flush", "--quick", "--no-save", "--hqq-group-size", "7"])
    err = capsys.readouterr().err
    assert code == 2
    assert "`hqq_group_size` (--hqq-group-size) 7 does not divide the K/V values of any power-of-two number of tokens" in err
    assert "use a divisor of 1024" in err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["flush", "--caches", "kivi4"], "--caches kivi4"),
        (["decode", "--candidates", "dynamic,kivi4-fused"], "--candidates dynamic,kivi4-fused"),
    ],
)
def test_a_group_size_no_cache_takes_is_refused(capsys, no_run, argv, named):
    code = main(["bench", *argv, "--quick", "--no-save", "--hqq-group-size", "32"])
    err = capsys.readouterr().err
    assert code == 2 and f"--hqq-group-size 32 applies to no cache of {named}" in err


@pytest.mark.parametrize("bench, cells", [("decode", "_decode_rows"), ("memory", "_row")])
def test_decode_and_memory_refuse_a_group_size_that_fails_every_hqq_cell(capsys, monkeypatch, bench, cells):
    """--hqq-group-size 7 ran kvlab bench decode / memory to the end, every hqq cell failing inside hqq
    ("group_size should be divisble ..."), exit 0 with --quick; now refused once the model's shape is known,
    before any cell (exit 2, the flag, the value and the shape named), as kvlab eval and bench flush do."""
    import importlib

    from kvlab.bench.prepare import BenchCandidate

    if BenchCandidate.parse("hqq4").unavailable_reason():
        pytest.skip("hqq is not installed: its cells are skipped, not failed")
    module = importlib.import_module(f"kvlab.bench.{bench}")
    monkeypatch.setattr(module, cells, lambda *a, **k: pytest.fail("a cell ran"))
    argv = ["bench", bench, "--quick", "--no-save", "--candidates", "dynamic,hqq4", "--hqq-group-size", "7"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"kvlab bench {bench}: error: `hqq_group_size` (--hqq-group-size) 7 does not divide the K/V values of " in err
    assert "2 KV heads x 256 tokens x head_dim 64" in err and "use a divisor of 128" in err


def test_a_names_own_group_size_is_the_one_checked():
    from kvlab.bench.prepare import BenchCandidate, check_model_shape, parse_candidates
    from kvlab.caches.registry import CacheSettings

    if BenchCandidate.parse("hqq4").unavailable_reason():
        pytest.skip("hqq is not installed: its cells are skipped, so not checked")
    shape = {"kv_heads": 2, "head_dim": 64}
    cands = parse_candidates(["dynamic", "hqq-4:hqq_group_size=32", "kivi4"])
    check_model_shape(cands, CacheSettings(hqq_group_size=7), shape, (256,))  # hqq's own 32 fits; kivi takes none
    with pytest.raises(ValueError, match=r"\(--hqq-group-size\) 7 does not divide"):
        check_model_shape(parse_candidates(["dynamic", "hqq4"]), CacheSettings(hqq_group_size=7), shape, (256,))
