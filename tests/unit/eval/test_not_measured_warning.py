"""A probe that does not fit a context leaves that context's rows without its gate: the summary must say so."""

from kvlab.eval.decision import not_measured_warning


def _result(missing):
    return {"provenance": {"long_context": {"not_measured": missing}}, "rows": []}


def test_names_every_probe_that_did_not_fit():
    missing = [
        {"probe": "recall", "context_length": 300, "reason": "context 300 is too short for recall: ..."},
        {
            "probe": "passkey",
            "context_length": 300,
            "reason": "context 300 is too short for the passkey: ...",
        },
    ]
    text = not_measured_warning(_result(missing))
    assert "recall at 300" in text and "passkey at 300" in text
    assert "gates do not apply" in text and "too short for recall" in text


def test_silent_when_everything_was_measured_or_long_context_is_off():
    assert not_measured_warning(_result([])) is None
    assert not_measured_warning({"provenance": {}, "rows": []}) is None
    assert not_measured_warning({"rows": []}) is None


def test_candidates_have_one_spelling():
    import pytest

    from kvlab.eval.candidates import check_candidate_names

    check_candidate_names(("dynamic", "kivi-4", "hqq-4"))
    for names, bad in (
        (("dynamic", "kivi-4", "kivi4"), "'kivi4' as 'kivi-4'"),
        (("dynamic", "Dynamic", "kivi-4"), "'Dynamic' as 'dynamic'"),
        (("DYNAMIC", "kivi-4"), "'DYNAMIC' as 'dynamic'"),
    ):
        with pytest.raises(ValueError, match=bad):
            check_candidate_names(names)
