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
