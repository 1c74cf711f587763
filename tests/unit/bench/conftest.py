import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


@pytest.fixture(scope="module")
def tiny_lm():
    """A tiny random Qwen2 (GQA 4/2, head_dim 64, 2 layers) in bf16: every cache of the benchmarks fits it."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=256,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=256,
        max_position_embeddings=4096,
    )
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
