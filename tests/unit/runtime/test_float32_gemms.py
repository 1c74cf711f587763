"""A bf16/fp16 model's Linear layers run as float32 GEMMs on a CPU that emulates the dtype (``--cpu-matmul``)."""

import pytest
import torch
import torch.nn.functional as F

from kvlab.eval.config import EvalConfig
from kvlab.eval.decision import dtype_warning
from kvlab.eval.metrics import run_generate
from kvlab.runtime.dtype_speed import SLOW_DTYPE_RATIO
from kvlab.runtime.dtypes import cpu_matmul_mode, float32_gemms
from tests.conftest import make_tiny_qwen2


def _net(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 32, bias=False)
    ).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_layer_is_the_float32_product_of_its_values_rounded_back(dtype):
    net = _net(dtype)
    x = torch.randn(5, 7, 48).to(dtype)
    first, second = net[0], net[2]
    h = F.gelu(F.linear(x.float(), first.weight.float(), first.bias.float()).to(dtype))
    expected = F.linear(h.float(), second.weight.float()).to(dtype)  # [5, 7, 32]
    with float32_gemms(net) as rerouted:
        got = net(x)
    assert rerouted == 2
    assert got.dtype == dtype and got.shape == (5, 7, 32)
    assert torch.equal(got, expected), "each layer must be exactly float32 GEMM + rounding to the layer dtype"
    # and the same product as the dtype's own kernel up to its rounding: one ulp of the output's magnitude
    native = net(x)
    ulp = torch.finfo(dtype).eps * native.float().abs().clamp_min(1e-3)
    assert ((got.float() - native.float()).abs() <= 2 * ulp).all()


def test_the_layers_are_restored_on_exit_and_after_an_error():
    net = _net()
    with float32_gemms(net):
        assert "forward" in vars(net[0]), "the layer's forward is rerouted inside the context"
    assert "forward" not in vars(net[0]) and not hasattr(net[0], "_kvlab_w32")
    with pytest.raises(RuntimeError, match="boom"):
        with float32_gemms(net):
            raise RuntimeError("boom")
    assert "forward" not in vars(net[0]) and "forward" not in vars(net[2])


def test_float32_layers_are_left_alone_and_a_non_module_is_named():
    net = _net(torch.float32)
    with float32_gemms(net) as rerouted:
        assert rerouted == 0 and "forward" not in vars(net[0])
    with pytest.raises(ValueError, match="list"):
        with float32_gemms([net]):
            pass


def test_a_bf16_model_generates_the_same_tokens_through_either_path():
    model = make_tiny_qwen2(head_dim=32, max_positions=256).to(torch.bfloat16)
    ids = torch.randint(3, 200, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        native = model(input_ids=ids).logits.float()
        with float32_gemms(model) as rerouted:
            rerouted_logits = model(input_ids=ids).logits.float()
    assert rerouted >= 7 * 2  # q, k, v, o, gate, up, down in each of 2 layers (and the head)
    assert (rerouted_logits - native).abs().max() <= 4 * torch.finfo(torch.bfloat16).eps * native.abs().max()


@pytest.mark.parametrize(
    ("requested", "ratio", "device", "mode"),
    [
        ("auto", 9.0, "cpu", "float32"),
        ("auto", SLOW_DTYPE_RATIO, "cpu", "native"),
        ("auto", 1.1, "cpu", "native"),
        ("native", 9.0, "cpu", "native"),
        ("float32", 1.1, "cpu", "float32"),
        ("auto", None, "cpu", "not applicable"),  # a float32 model
        ("float32", None, "cpu", "not applicable"),
        ("auto", None, "cuda", "not applicable"),
        ("native", None, "cuda", "not applicable"),
    ],
)
def test_the_mode_a_run_uses(requested, ratio, device, mode):
    assert cpu_matmul_mode(requested, ratio, torch.device(device)) == mode


def test_float32_gemms_on_a_gpu_are_refused():
    with pytest.raises(ValueError, match="cuda"):
        cpu_matmul_mode("float32", None, torch.device("cuda"))
    with pytest.raises(ValueError, match="cpu_matmul"):
        EvalConfig(cpu_matmul="float32", device="cuda")
    with pytest.raises(ValueError, match="'fp32'"):
        EvalConfig(cpu_matmul="fp32")
    with pytest.raises(ValueError, match="'fp32'"):
        cpu_matmul_mode("fp32", 9.0, torch.device("cpu"))


def _result(mode):
    hardware = {
        "device": "cpu",
        "cpu_capability": "AVX2",
        "matmul_time_ratio_vs_float32": 8.0,
        "cpu_matmul": mode,
    }
    return {"provenance": {"hardware": hardware, "model": {"dtype": "bfloat16"}}, "rows": []}


def test_the_warning_says_which_path_the_run_took():
    rerouted = dtype_warning(_result("float32"))
    assert "float32 GEMMs on bfloat16 values" in rerouted and "--cpu-matmul native" in rerouted
    native = dtype_warning(_result("native"))
    assert "emulated bfloat16" in native and "--cpu-matmul auto" in native and "--dtype float32" in native
    assert "ran its attention (SDPA) in float32" in rerouted
    kept = _result("float32")
    kept["provenance"]["hardware"].update(
        float32_attention=False, float32_attention_note="no custom attention"
    )
    assert "its attention stayed bfloat16: no custom attention" in dtype_warning(kept)


def test_run_generate_without_timed_calls_still_yields_outputs_and_memory():
    model = make_tiny_qwen2(head_dim=32, max_positions=256)
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(2))
    from transformers import DynamicCache

    perf, cache, generated = run_generate(model, ids, DynamicCache, 5, 0, 0, 0, True)
    assert generated.shape == (1, 5) and cache.get_seq_length() == 24 + 4
    assert perf["median_ms"] is None and perf["timings_ms"] == [] and perf["incremental_peak_bytes"] > 0
    perf, _, generated = run_generate(model, ids, DynamicCache, 5, 0, 0, 0, False)
    assert generated.shape == (1, 5) and perf["incremental_peak_bytes"] is None
    with pytest.raises(ValueError, match="repeat"):
        run_generate(model, ids, DynamicCache, 5, 0, -1, 0)


def test_the_float32_copies_must_fit_in_memory(monkeypatch):
    from kvlab.runtime import dtypes

    net = _net()
    need = dtypes.float32_copy_bytes(net)
    assert need == 4 * (48 * 96 + 96 + 96 * 32)
    monkeypatch.setattr(dtypes, "matmul_time_ratio", lambda dtype, device: 9.0)
    cpu = torch.device("cpu")
    record, gemms = dtypes.cpu_matmul_policy(net, "auto", cpu, available_bytes=2 * need)
    assert record["cpu_matmul"] == "float32" and "cpu_matmul_note" not in record
    record, gemms = dtypes.cpu_matmul_policy(net, "auto", cpu, available_bytes=2 * need - 1)
    assert (
        record["cpu_matmul"] == "native"
        and "more than half the available memory" in record["cpu_matmul_note"]
    )
    with gemms:
        assert "forward" not in vars(net[0]), "the fallback changes nothing"
    with pytest.raises(ValueError, match="float32 copies of the Linear weights"):
        dtypes.cpu_matmul_policy(net, "float32", cpu, available_bytes=need)
    record, _ = dtypes.cpu_matmul_policy(net, "auto", cpu, available_bytes=None)  # unknown: no check
    assert record["cpu_matmul"] == "float32"
    warning = dtype_warning(
        {
            "provenance": {
                "hardware": {
                    "matmul_time_ratio_vs_float32": 9.0,
                    "cpu_matmul": "native",
                    "cpu_matmul_note": "copies too big: torch's own kernels were used",
                }
            }
        }
    )
    assert (
        warning.endswith("copies too big: torch's own kernels were used")
        and "--cpu-matmul auto" not in warning
    )


def test_available_memory_is_read_from_the_os():
    from kvlab.runtime.provenance import available_memory_bytes

    free = available_memory_bytes()
    assert free is None or free > 0


def test_a_layer_with_its_own_instance_forward_is_left_alone():
    net = _net()
    hooked = net[0].forward  # what accelerate's add_hook_to_module does: a forward on the instance

    def hook(x):
        return hooked(x)

    net[0].forward = hook
    with float32_gemms(net) as rerouted:
        assert rerouted == 1 and net[0].forward is hook
    assert net[0].forward is hook, "the hook survives the context"


def test_attention_is_float32_sdpa_rounded_back_only_inside_the_context():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kvlab.attention.interface import sdpa
    from kvlab.runtime.dtypes import float32_attention

    gen = torch.Generator().manual_seed(3)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    q = torch.randn(2, 4, 6, 16, generator=gen).to(torch.bfloat16)  # [B, Hq, q, D]
    k = torch.randn(2, 2, 9, 16, generator=gen).to(torch.bfloat16)  # [B, Hkv, kv, D]
    v = torch.randn(2, 2, 9, 16, generator=gen).to(torch.bfloat16)
    mask = torch.ones(2, 1, 6, 9, dtype=torch.bool).tril(3)
    expected32, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask)
    native, _ = sdpa_attention_forward(module, q, k, v, mask)
    assert not float32_attention()
    assert torch.equal(sdpa(module, q, k, v, mask)[0], native), (
        "outside the context: transformers' SDPA as is"
    )
    with float32_gemms(_net()):
        assert float32_attention()
        got, _ = sdpa(module, q, k, v, mask)
    assert not float32_attention(), "the flag ends with the context"
    assert got.dtype == torch.bfloat16 and got.shape == (2, 6, 4, 16)
    assert torch.equal(got, expected32.to(torch.bfloat16))
    fp32 = torch.randn(2, 4, 6, 16, generator=gen)  # a float32 model is never touched
    with float32_gemms(_net()):
        assert torch.equal(
            sdpa(module, fp32, k.float(), v.float(), mask)[0],
            sdpa_attention_forward(module, fp32, k.float(), v.float(), mask)[0],
        )


def test_the_eval_routes_every_cache_through_float32_attention_with_float32_gemms(monkeypatch):
    from kvlab.attention import interface

    model = make_tiny_qwen2(head_dim=32, max_positions=256).to(torch.bfloat16)
    calls = []
    real = interface.sdpa

    def spy(module, query, *args, **kwargs):
        out = real(module, query, *args, **kwargs)
        calls.append(interface.float32_attention())
        return out

    monkeypatch.setattr(interface, "sdpa", spy)
    interface.enable(model)
    ids = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode(), float32_gemms(model):
        model(input_ids=ids)
    assert calls and all(calls), "a dynamic cache's attention goes through the float32 SDPA"


def test_a_model_without_custom_attention_still_runs_with_float32_gemms(monkeypatch):
    from kvlab.attention import interface
    from kvlab.eval.runner import new_result, run_eval
    from kvlab.runtime import dtypes
    from tests.unit.eval.test_eval_unit import CharTokenizer, tiny_config

    def refuse(model):
        raise ValueError("this model does not support custom attention")

    monkeypatch.setattr(interface, "enable", refuse)
    monkeypatch.setattr("kvlab.attention.enable", refuse)
    monkeypatch.setattr(dtypes, "matmul_time_ratio", lambda dtype, device: 9.0)
    model = make_tiny_qwen2(head_dim=32, max_positions=256).to(torch.bfloat16)
    cfg = tiny_config(
        candidates=("dynamic", "kivi-8"),
        kivi_attention="dequantize",
        window_residuals=(),
        contexts=(40,),
        threads=1,
    )
    result = new_result(cfg, "unit", None)
    run_eval(cfg, model, CharTokenizer(), result, {"id_or_path": "tiny"})
    hardware = result["provenance"]["hardware"]
    assert result["status"] == "complete" and hardware["cpu_matmul"] == "float32"
    assert (
        hardware["float32_attention"] is False
        and "does not support custom attention" in hardware["float32_attention_note"]
    )
    assert "its attention stayed bfloat16" in result["summary"]["dtype_warning"]
