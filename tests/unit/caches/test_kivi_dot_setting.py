"""KIVI's key-score path as a per-cache setting (``kivi-4:dot=int8``): the registry grammar takes the word, the
cache runs fused attention and records what its attention ran; a name that cannot run the integer path is
refused by name."""

from __future__ import annotations

import pytest

from kvlab.attention import cpu_kernel
from kvlab.cache_names import KIVI_DOT_PATHS
from kvlab.caches.kivi import KIVICache
from kvlab.caches.registry import make_cache, resolve
from kvlab.eval.candidates import check_candidate_names
from kvlab.eval.twins import exact_twin_name


def test_the_settings_know_the_kernels_paths():
    assert KIVI_DOT_PATHS == cpu_kernel.DOT_PATHS


def test_dot_int8_resolves_to_fused_attention_and_is_described():
    r = resolve("kivi-4:dot=int8")
    assert r.settings.dot == "int8" and r.uses_kvlab_attention
    assert r.describe()["attention"] == "fused" and r.describe()["dot"] == "int8"
    assert "dot" not in resolve("kivi-4").describe()  # the default path is not written: records unchanged
    assert resolve("kivi-4-fused:dot=int8-keys").settings.dot == "int8-keys"


@pytest.mark.parametrize("name", ["kivi-k8v4:dot=int8", "kivi-4-dequant:dot=int8"])
def test_a_name_that_cannot_run_fused_is_refused_with_dot(name):
    with pytest.raises(ValueError, match=rf"cache '{name}': `dot=int8` is a path of fused attention"):
        resolve(name)


@pytest.mark.parametrize(
    "name, match",
    [
        ("kivi-4:dot=fast", r"`dot` must be one of \['exact', 'int8', 'int8-keys'\], got 'fast'"),
        ("kivi-4:group_size=abc", r"setting 'group_size=abc' must be name=value"),
        ("fp8-e4m3:dot=int8", r"`fp8` settings are none, got \['dot'\]"),
    ],
)
def test_bad_dot_values_and_words_for_numbers_are_named(name, match):
    with pytest.raises(ValueError, match=match):
        resolve(name)


def test_the_cache_refuses_an_integer_path_without_fused_attention():
    with pytest.raises(
        ValueError, match=r"`dot`='int8' is a path of fused attention, got attention='dequantize'"
    ):
        KIVICache(nbits=4, dot="int8")
    with pytest.raises(ValueError, match=r"`dot` must be one of"):
        KIVICache(nbits=4, attention="fused", dot="int4")


def test_a_dequantize_cache_ran_no_fused_path():
    assert make_cache("kivi-4").attention_paths() == []


def test_eval_takes_the_twin_and_names_its_exact_twin():
    check_candidate_names(("dynamic", "kivi-4", "kivi-4:dot=int8"), "fused")
    assert exact_twin_name(resolve("kivi-4:dot=int8").name) == "kivi-4"
    assert exact_twin_name(resolve("kivi-2-fused:dot=int8").name) == "kivi-2-fused"
    assert exact_twin_name(resolve("kivi-4").name) is None
    assert exact_twin_name(resolve("kivi-4:dot=exact").name) is None


def _decoded_paths(name: str) -> list[str]:
    """What a KIVI cache's attention ran over a prompt past its residual window and a few decode steps."""
    import torch

    from kvlab.attention import enable
    from kvlab.runtime.hf_api import cache_kwarg
    from tests.conftest import make_tiny_qwen2

    model = enable(make_tiny_qwen2(head_dim=32, max_positions=512))
    cache = make_cache(name, model.config)
    kw = cache_kwarg(model)
    ids = torch.randint(1, 256, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(input_ids=ids[:, :190], use_cache=True, **{kw: cache})
        for s in range(190, 200):
            model(input_ids=ids[:, s : s + 1], use_cache=True, **{kw: cache})
    return cache.attention_paths()


def test_int8_where_the_kernel_is_off_is_recorded_as_the_exact_torch_path(monkeypatch):
    monkeypatch.setenv("KVLAB_CPU_KERNEL", "0")
    (path,) = _decoded_paths("kivi-4:dot=int8")
    assert path.startswith("exact (torch: disabled by KVLAB_CPU_KERNEL=0; int8 asked"), path


@pytest.mark.skipif(cpu_kernel.unavailable_reason() is not None, reason="the CPU kernel cannot be built here")
def test_int8_at_bits_it_does_not_take_is_recorded_as_exact():
    (path,) = _decoded_paths("kivi-8:dot=int8")
    assert path.startswith("exact (int8 does not take 8-bit codes"), path
