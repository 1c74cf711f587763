"""Copy-task placement in scripts/train_reference.py's TaskMixer: where --near-copy-p and --mid-copy-p put the
distance between the two copies of a span (the distances kvlab eval's copy probes score)."""

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]
T, L = 4352, 32


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(ROOT / "src" / "kvlab" / "models" / "reference")


def distances(tr, tokenizer, n: int = 300, **kw) -> list[int]:
    stream = torch.randint(1, 100, (10_000,), generator=torch.Generator().manual_seed(0))
    mixer = tr.TaskMixer(tokenizer, stream, 1.0, torch.Generator().manual_seed(1), **kw)
    out = []
    for _ in range(n):
        free = torch.ones(T, dtype=torch.bool)
        a, b = mixer._place_pair(free, L, T)
        assert not free[a : a + L].any() and not free[b : b + L].any()  # both spans are marked taken
        out.append(b - a)
    return out


def test_mid_copies_land_in_the_middle_of_the_window(tr, tokenizer):
    lo, hi = (int(f * T) for f in tr.MID_COPY_RANGE)
    d = distances(tr, tokenizer, mid_copy_p=1.0)
    assert min(d) >= lo and max(d) <= hi
    assert max(d) - min(d) > (hi - lo) // 2  # spread over the range, not one distance


def test_near_copies_stay_within_the_near_limit(tr, tokenizer):
    d = distances(tr, tokenizer, near_copy_p=1.0)
    assert L <= min(d) and max(d) <= tr.NEAR_COPY_TOKENS


def test_default_copies_cover_the_whole_window(tr, tokenizer):
    lo, hi = (int(f * T) for f in tr.MID_COPY_RANGE)
    d = distances(tr, tokenizer)
    assert sum(x < lo for x in d) > 20 and sum(x > hi for x in d) > 20


def test_mixed_shares_follow_the_probabilities(tr, tokenizer):
    lo, hi = (int(f * T) for f in tr.MID_COPY_RANGE)
    d = distances(tr, tokenizer, n=600, near_copy_p=0.5, mid_copy_p=0.5)
    near = sum(x <= tr.NEAR_COPY_TOKENS for x in d)
    mid = sum(lo <= x <= hi for x in d)
    assert near + mid == len(d)
    assert 240 <= near <= 360 and 240 <= mid <= 360


@pytest.mark.parametrize("near,mid", [("0.3", "0.8"), ("0", "-0.1"), ("0", "1.5")])
def test_shares_over_one_are_refused_naming_the_value(tr, near, mid, capsys):
    with pytest.raises(SystemExit):
        tr.parse_args(["--near-copy-p", near, "--mid-copy-p", mid])
    assert f"--mid-copy-p must be in [0, 1 - --near-copy-p], got {float(mid)!r}" in capsys.readouterr().err
