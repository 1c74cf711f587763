"""The README's "KIVI cache in your own code" snippet runs as printed, with no ``past_key_values`` FutureWarning.

The snippet is read from README.md (so an edit there is what is tested); only its sizes shrink (a 1,024-token
prompt and 64 new tokens take ~40 s on one CPU thread): the calls and arguments stay the README's.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from kvlab.models import reference_model_path

README = Path(__file__).resolve().parents[2] / "README.md"
SHRINK = {"(1, 1024)": "(1, 48)", "max_new_tokens=64": "max_new_tokens=4"}


def _snippet() -> str:
    match = re.search(r"### KIVI cache in your own code\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md has no python block under '### KIVI cache in your own code'"
    code = match.group(1)
    for old, new in SHRINK.items():
        assert old in code, f"the README snippet no longer contains {old!r}: update SHRINK"
        code = code.replace(old, new)
    return code


@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.24.0"),
    reason="the README shows `cache=`, the argument's name from transformers 5.24 on",
)
def test_readme_snippet_runs_without_past_key_values_warning(capsys):
    if not (reference_model_path() / "model.safetensors").is_file():
        pytest.skip("the bundled reference model is not in this checkout")
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r".*`past_key_values`", category=FutureWarning)
        exec(compile(_snippet(), str(README), "exec"), namespace)
    cache = namespace["cache"]  # the snippet's last cache: fused, built after kvlab.attention.enable
    assert cache.attention == "fused"
    assert namespace["out"].shape == (1, 48 + 4)
    printed = capsys.readouterr().out
    assert "'total'" in printed  # the snippet printed nbytes() and nbytes_breakdown()
