"""RULER's scoring on hand-made outputs: all, part and none of the references found."""

import pytest

from kvlab.tasks import sample_score, string_match_all, string_match_part

REFS = ("1234567", "7654321", "ABCDE")


@pytest.mark.parametrize(
    "output, all_score, part_score",
    [
        (" 1234567, 7654321 and abcde.", 1.0, 1.0),  # all found (case-insensitive)
        (" 7654321 and then 99.", 1 / 3, 1.0),  # part
        (" 123456 765432 ABCD", 0.0, 0.0),  # none: near misses are misses
    ],
)
def test_all_part_none(output, all_score, part_score):
    assert string_match_all(output, REFS) == pytest.approx(all_score)
    assert string_match_part(output, REFS) == part_score
    score, correct = sample_score(output, REFS, "all")
    assert correct == (all_score == 1.0) and score == pytest.approx(all_score)
    assert sample_score(output, REFS, "part") == (part_score, part_score == 1.0)


def test_bad_input():
    with pytest.raises(ValueError, match="non-empty sequence"):
        string_match_all("x", [])
    with pytest.raises(ValueError, match="non-empty sequence"):
        string_match_all("x", "abc")  # a bare string is not a list of references
    with pytest.raises(ValueError, match="`metric` must be one of"):
        sample_score("x", ["x"], "any")
    with pytest.raises(TypeError, match="`output` must be a str"):
        string_match_part(None, ["x"])
