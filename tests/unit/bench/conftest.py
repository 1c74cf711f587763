import pytest
import torch

from tests.conftest import make_tiny_qwen2


@pytest.fixture(scope="module")
def tiny_lm():
    """A tiny random Qwen2 (GQA 4/2, head_dim 64, 2 layers) in bf16: every cache of the benchmarks fits it."""
    return make_tiny_qwen2(head_dim=64, max_positions=4096, dtype=torch.bfloat16)
