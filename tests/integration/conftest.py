"""Integration fixtures: the bundled reference model, loaded once per session."""

import pytest

from kvlab.models import reference_model_path


@pytest.fixture(scope="session")
def reference_bf16():
    """(model, tokenizer) of the bundled model in bfloat16 on CPU (the eval default)."""
    if not (reference_model_path() / "model.safetensors").is_file():
        pytest.skip("the bundled reference model is not in this checkout")
    from kvlab.models import load_model

    return load_model(None, dtype="bfloat16", device="cpu")
