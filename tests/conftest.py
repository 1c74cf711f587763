import os

import pytest
import torch
from hypothesis import settings
from transformers import Qwen2Config, Qwen2ForCausalLM

# CI runs every property test on the same examples (a random failure there blocks a landing without telling
# anything new); locally, Hypothesis keeps exploring new examples. Found failures get a regression test.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def make_tiny_qwen2(head_dim: int, max_positions: int, dtype: torch.dtype = torch.float32, layers: int = 2):
    """A tiny random Qwen2 (vocab 256, hidden 128, ``layers`` layers, GQA 4/2), seeded, in eval mode."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=256,
        hidden_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        intermediate_size=256,
        max_position_embeddings=max_positions,
    )
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def random_prompt(batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """``[batch, tokens]`` random ids in [1, 256) (the tiny Qwen2's vocabulary), seeded."""
    return torch.randint(1, 256, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def no_grad():
    """Run the test under ``torch.no_grad()`` (cache tests that call the model directly)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="session")
def tiny_qwen2():
    """A tiny random Qwen2 (GQA 4/2, head_dim 32, 2 layers) in fp32 for fast cache tests."""
    return make_tiny_qwen2(head_dim=32, max_positions=2048)


@pytest.fixture
def gemm_spy(monkeypatch):
    """``entered``: one ``(model, layers rerouted)`` per entry into :func:`kvlab.runtime.dtypes.float32_gemms`
    during the test (the real context runs; the spy only records)."""
    import contextlib

    from kvlab.runtime import dtypes

    entered = []
    real = dtypes.float32_gemms

    @contextlib.contextmanager
    def spy(model):
        with real(model) as n:
            entered.append((model, n))
            yield n

    monkeypatch.setattr(dtypes, "float32_gemms", spy)
    return entered


def _chromium_binary():
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def chromium_screenshot(tmp_path):
    """``shoot(page_path) -> pixels [2000, 1280, 3]``: render a local page in headless Chromium (skip if absent)."""
    import subprocess

    browser = _chromium_binary()
    if browser is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")

    def shoot(page):
        import matplotlib.image

        shot = tmp_path / "shot.png"
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,2000",
            page.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert shot.exists(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
        return matplotlib.image.imread(shot)[..., :3]

    return shoot
