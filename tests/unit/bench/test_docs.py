"""The PERFORMANCE.md generator: tables from synthetic records, target verdicts computed from their numbers."""

import json

import pytest

from kvlab.bench import docs, results


def _record(benchmark, result, device_gpu=None, quick=False):
    return {
        "format": results.FORMAT,
        "benchmark": benchmark,
        "command": f"kvlab bench {benchmark}",
        "quick": quick,
        "created_utc": "2026-11-30T00:00:00Z",
        "machine": {"cpu": "test cpu", "cpu_count": 2, "torch_threads": 2, "gpu": device_gpu},
        "note": "shared 2-core VM",
        "result": result,
    }


def _decode_result(ratio_at_4096, device_type="cpu"):
    rows = []
    for ctx in (1024, 4096):
        rows.append(
            {
                "candidate": "dynamic",
                "context": ctx,
                "status": "ok",
                "median_ms": 10.0,
                "ratio_to_dynamic": 1.0,
                "cache_bytes": 2**20,
            }
        )
        r = ratio_at_4096 if ctx == 4096 else 2.0
        rows.append(
            {
                "candidate": "kivi4-fused",
                "context": ctx,
                "status": "ok",
                "median_ms": 10.0 * r,
                "ratio_to_dynamic": r,
                "cache_bytes": 2**18,
            }
        )
    rows.append({"candidate": "hqq4", "context": 1024, "status": "failed", "error": "RuntimeError: boom"})
    return {
        "device": device_type,
        "device_type": device_type,
        "model": {
            "name": "m",
            "architecture": "A",
            "layers": 2,
            "q_heads": 4,
            "kv_heads": 2,
            "head_dim": 64,
            "dtype": "bfloat16",
            "parameters": 1e6,
        },
        "settings": {"steps": 4, "warmup": 1, "prefill_chunk_tokens": 1024, "dtype": "bfloat16"},
        "contexts": [1024, 4096],
        "candidates": [{"name": "dynamic"}, {"name": "kivi4-fused"}, {"name": "hqq4"}],
        "prompt_source": "random",
        "rows": rows,
        "profile": None,
    }


def _flush_result(us_1k, us_16k):
    rows = [
        {"cache": "kivi4", "context": 1024, "status": "ok", "flush_us": us_1k, "plain_append_us": 50.0},
        {"cache": "kivi4", "context": 16384, "status": "ok", "flush_us": us_16k, "plain_append_us": 50.0},
    ]
    return {
        "device": "cpu",
        "device_type": "cpu",
        "shape": {"batch": 1, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"},
        "settings": {"group_size": 32, "residual_length": 128, "hqq_group_size": 64, "reps": 3, "hf_reps": 1},
        "contexts": [1024, 16384],
        "rows": rows,
        "ratios": {"kivi4": {"from_context": 1024, "to_context": 16384, "ratio": us_16k / us_1k}},
    }


def _write(tmp_path, name, record):
    (tmp_path / name).write_text(json.dumps(record))


def _verdict(verdicts, prefix):
    (v,) = [v for v in verdicts if v["description"].startswith(prefix) and v["file"] != "-"]
    return v


@pytest.mark.parametrize("ratio, status", [(1.05, "met"), (1.10, "met"), (1.30, "not met")])
def test_decode_target_is_computed_from_the_numbers(tmp_path, ratio, status):
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(ratio)))
    verdicts = docs.targets(results.read_records(tmp_path))
    v = _verdict(verdicts, "kivi-4-fused decode")
    assert v["status"] == status and f"{ratio:.3f}x" in v["detail"]


def test_gpu_targets_are_not_measured_without_a_cuda_record(tmp_path):
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(1.0)))
    gpu = [v for v in docs.targets(results.read_records(tmp_path)) if v["device"] == "H200"]
    assert {v["status"] for v in gpu} == {"not measured"} and len(gpu) == 2


def test_cuda_decode_target_uses_contexts_from_32k(tmp_path):
    res = _decode_result(0.9, device_type="cuda")
    for row in res["rows"]:
        if row["context"] == 4096:
            row["context"] = 32768
    res["contexts"] = [1024, 32768]
    _write(tmp_path, "decode-nvidia-h200.json", _record("decode", res, device_gpu="NVIDIA H200"))
    verdicts = docs.targets(results.read_records(tmp_path))
    (v,) = [v for v in verdicts if v["file"] == "decode-nvidia-h200.json"]
    assert v["status"] == "met" and v["device"] == "NVIDIA H200"  # 2.0x at 1024 does not count
    assert not [v for v in verdicts if v["device"] == "H200" and "decode" in v["description"]]


@pytest.mark.parametrize("us_16k, status", [(110.0, "met"), (300.0, "not met")])
def test_flush_target(tmp_path, us_16k, status):
    _write(tmp_path, "flush-cpu.json", _record("flush", _flush_result(100.0, us_16k)))
    v = _verdict(docs.targets(results.read_records(tmp_path)), "kivi4 flush")
    assert v["status"] == status


def test_page_has_tables_commands_and_verdicts(tmp_path):
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(1.3)))
    _write(tmp_path, "flush-cpu.json", _record("flush", _flush_result(100.0, 110.0)))
    out = docs.write_page(tmp_path, tmp_path / "PERFORMANCE.md")
    text = out.read_text()
    assert docs.MARKER in text
    assert "| context | `dynamic` | `kivi-4-fused` | `hqq-4` |" in text
    assert "| 4096 | 10.00 | 13.00 (1.30x) | - |" in text
    assert "| 1024 | 10.00 | 20.00 (2.00x) | failed |" in text
    assert "RuntimeError: boom" in text
    assert "Command: `kvlab bench decode`" in text and "Note: shared 2-core VM" in text
    assert "| 1024 | 100 (50) |" in text and "1.10x" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("| kivi-4-fused decode <= 1.10x")]
    assert len(lines) == 1 and "**not met**" in lines[0]
    lines = [ln for ln in text.splitlines() if ln.startswith("| kivi4 flush at 16384")]
    assert len(lines) == 1 and "**met**" in lines[0]


def test_quick_records_are_left_out_unless_asked(tmp_path):
    _write(tmp_path, "decode-cpu-quick.json", _record("decode", _decode_result(1.0), quick=True))
    assert results.read_records(tmp_path) == []
    assert len(results.read_records(tmp_path, include_quick=True)) == 1


def test_records_of_other_kvlab_scripts_are_skipped(tmp_path):
    """benchmarks/busy_eval.py keeps its record next to the bench records; `kvlab bench docs` must still run."""
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(1.0)))
    (tmp_path / "busy-eval-cpu.json").write_text('{"format": "kvlab-busy-eval/1", "wall_ratio": 2.2}')
    assert [p.name for p, _ in results.read_records(tmp_path)] == ["decode-cpu.json"]


def test_foreign_files_are_refused(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a kvlab bench record"):
        results.read_records(tmp_path)
    page = tmp_path / "sub" / "PERFORMANCE.md"
    page.parent.mkdir()
    page.write_text("# hand-written\n")
    (tmp_path / "x.json").unlink()
    with pytest.raises(ValueError, match="holds no kvlab bench record"):  # a page read from nothing
        docs.write_page(tmp_path, page, force=True)
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(1.0)))
    with pytest.raises(FileExistsError, match="not generated"):
        docs.write_page(tmp_path, page)
    docs.write_page(tmp_path, page, force=True)
    assert docs.MARKER in page.read_text()


def _lead_result(k4: dict, k2: dict, hqq: dict) -> dict:
    rows = []
    for name, ratios in (
        ("dynamic", dict.fromkeys(k4, 1.0)),
        ("kivi4-fused", k4),
        ("kivi2-fused", k2),
        ("hqq4", hqq),
    ):
        rows += [
            {"candidate": name, "context": c, "status": "ok", "ratio_to_dynamic": r}
            for c, r in ratios.items()
        ]
    return {"device_type": "cpu", "rows": rows}


def test_lead_targets_met_when_every_ratio_is_inside():
    from kvlab.bench.decode import evaluate_lead_targets

    k4 = {1024: 0.95, 4096: 0.7, 16384: 0.45}
    k2 = {1024: 0.95, 4096: 0.6, 16384: 0.4}  # 0.86 and 0.89 of kivi4 from 4096 on
    hqq = {1024: 1.2, 4096: 1.2, 16384: 1.3}
    assert [v["status"] for v in evaluate_lead_targets(_lead_result(k4, k2, hqq))] == ["met"] * 3


@pytest.mark.parametrize(
    "k4, k2, hqq, failing",
    [
        ({1024: 1.01, 4096: 0.7, 16384: 0.45}, {1024: 0.9, 4096: 0.6, 16384: 0.4}, None, 0),  # 1.01x at 1024
        ({1024: 0.9, 4096: 0.7, 16384: 0.51}, {1024: 0.9, 4096: 0.6, 16384: 0.4}, None, 0),  # 0.51x at 16384
        (
            {1024: 0.9, 4096: 0.7, 16384: 0.45},
            {1024: 0.9, 4096: 0.7, 16384: 0.4},
            None,
            1,
        ),  # 2-bit = 4-bit at 4096
        (
            {1024: 0.9, 4096: 0.7, 16384: 0.45},
            {1024: 1.3, 4096: 0.6, 16384: 0.4},
            None,
            2,
        ),  # kivi2 slower than hqq4
    ],
)
def test_each_lead_target_fails_on_its_own(k4, k2, hqq, failing):
    from kvlab.bench.decode import evaluate_lead_targets

    hqq = hqq or {1024: 1.2, 4096: 1.2, 16384: 1.3}
    statuses = [v["status"] for v in evaluate_lead_targets(_lead_result(k4, k2, hqq))]
    assert statuses == ["not met" if i == failing else "met" for i in range(3)], statuses


def test_lead_targets_not_measured_without_the_long_context_or_the_peers():
    from kvlab.bench.decode import evaluate_lead_targets

    k4 = {1024: 0.9, 4096: 0.7}
    statuses = [v["status"] for v in evaluate_lead_targets(_lead_result(k4, {}, {}))]
    assert statuses == ["not measured"] * 3


def test_the_decode_section_names_the_gemm_path_when_recorded():
    from kvlab.bench.docs import _gemm_note

    assert _gemm_note({}) == "" and _gemm_note({"cpu_matmul": "not applicable"}) == ""
    note = _gemm_note({"cpu_matmul": "float32", "matmul_time_ratio_vs_float32": 10.96, "dtype": "bfloat16"})
    assert "float32 GEMMs" in note and "11.0x" in note and "bfloat16" in note
    assert "torch's own bfloat16 kernels" in _gemm_note({"cpu_matmul": "native", "dtype": "bfloat16"})


def test_a_decode_record_without_kivi_gets_no_kivi_targets(tmp_path):
    """An FP8-only `bench decode` record (benchmarks/results/decode-fp8-cpu.json) once put four KIVI target rows in
    PERFORMANCE.md, "not measured: no 4096-token cell" although it had one."""
    from kvlab.bench.decode import evaluate_target

    fp8 = _decode_result(1.0)
    fp8["rows"] = [
        dict(r, candidate="fp8-e4m3") if r["candidate"] == "kivi4-fused" else r for r in fp8["rows"]
    ]
    _write(tmp_path, "decode-fp8-cpu.json", _record("decode", fp8))
    _write(tmp_path, "decode-cpu.json", _record("decode", _decode_result(1.05)))
    verdicts = docs.targets(results.read_records(tmp_path))
    assert not [v for v in verdicts if v["file"] == "decode-fp8-cpu.json"]
    assert _verdict(verdicts, "kivi-4-fused decode")["file"] == "decode-cpu.json"
    assert evaluate_target(fp8)["detail"] == "no kivi-4-fused cell"


def test_the_committed_page_is_what_the_committed_records_render(tmp_path, monkeypatch):
    """docs/PERFORMANCE.md is generated: a clean checkout's `kvlab bench docs` must leave it unchanged (a stale
    page made a user's checkout dirty the first time they rendered the records)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(
        root
    )  # the page names the records' folder as given, as `kvlab bench docs` run here does
    page = docs.write_page("benchmarks/results", tmp_path / "PERFORMANCE.md")
    assert Path(page).read_text(encoding="utf-8") == (root / "docs" / "PERFORMANCE.md").read_text(
        encoding="utf-8"
    )


def test_cuda_kernel_target_stays_on_the_eager_call_and_names_the_graph_replay():
    from kvlab.bench.kernel import evaluate_target

    def kernel(us):  # 1 GB read in `us` microseconds, against a 4,000 GB/s copy
        gb_s = 1e9 / (us * 1e-6) / 1e9
        return {"bytes": 10**9, "us": us, "gb_s": gb_s, "fraction_of_copy": gb_s / 4000}

    rows = [
        {
            "context": c,
            "status": "ok",
            "kivi_fraction_of_copy": kernel(eager)["fraction_of_copy"],
            "kernels": {"kivi4": kernel(eager), "kivi4-graph": kernel(graph), "sdpa": kernel(500.0)},
        }
        for c, eager, graph in ((16384, 5000.0, 400.0), (32768, 1000.0, 300.0))
    ]
    result = {"device_type": "cuda", "device_name": "NVIDIA H200", "settings": {"nbits": [4, 2]}, "rows": rows}
    v = evaluate_target(result)
    # eager 25 % at 32k misses 70 %; the graph replay (62 %, 83 %) is reported beside it, not judged
    assert v["status"] == "not met" and v["fractions"] == {32768: 0.25}
    assert "25% at 32768" in v["detail"] and "CUDA-graph replay 62% at 16384, 83% at 32768" in v["detail"]
