import pytest

from kvlab.lab import ToyConfig, run_toy_lab


@pytest.fixture(scope="session")
def seed_lab_result():
    """The seed's toy experiment (GQA 8/2, 16 + 192 tokens), run once for every test that reads it."""
    return run_toy_lab(ToyConfig(), repeat=1, warmup=False)
