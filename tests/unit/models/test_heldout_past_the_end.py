"""`kvlab inspect --tokens 100000000` said 'held-out text has 102495 tokens' with no separator, where kvlab groups
every count it prints (the flags the user typed are echoed as typed)."""

from __future__ import annotations

import re

import pytest

from kvlab.cli import main
from kvlab.models import reference_model_path


@pytest.mark.skipif(not (reference_model_path() / "model.safetensors").is_file(), reason="no bundled model")
def test_inspect_past_the_held_out_text_groups_the_count(capsys):
    assert main(["inspect", "--tokens", "100000000"]) == 2
    err = capsys.readouterr().err
    found = re.search(r"held-out text has ([\d,]+) tokens under this tokenizer; --offset 0 \+ --tokens 100000000", err)
    assert found and re.fullmatch(r"\d{1,3}(,\d{3})+", found[1]), err
