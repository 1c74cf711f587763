"""The converted-model cache as a new user met it: a GGUF copied under another name is not converted again (the
file's sha256 is its identity), a damaged converted folder is made again instead of failing in transformers,
``kvlab models get`` interrupted ends in one line with status 130, the GGUF reader's own progress bar stays off,
an empty ``--model`` is refused instead of read as the current directory, and a hub id that is neither cached nor
reachable is bad input (status 2) before any work."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.models import check_local_model, sources
from kvlab.models.sources import find_source, prepare_source

pytest.importorskip("gguf")
from tests.unit.models.test_sources import write_model_gguf  # noqa: E402


@pytest.fixture(autouse=True)
def model_dir(tmp_path, monkeypatch):
    folder = tmp_path / "model-cache"
    monkeypatch.setenv("KVLAB_MODEL_DIR", str(folder))
    return folder


def whole_folder(out: Path) -> None:
    """What a conversion leaves: config, one safetensors file, a tokenizer."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    save_file({"w": torch.zeros(64, 64)}, str(out / "model.safetensors"))
    (out / "tokenizer.json").write_text("{}")


@pytest.fixture
def conversions(monkeypatch):
    """Conversions are counted and write a whole folder (transformers is not run)."""
    calls = []

    def convert(gguf_path, out, header):
        calls.append(gguf_path.name)
        whole_folder(out)

    monkeypatch.setattr(sources, "_dequantize_into", convert)
    return calls


def test_a_copy_under_another_name_finds_the_first_conversion(tmp_path, conversions):
    first = prepare_source(str(write_model_gguf(tmp_path / "m.gguf")))
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(tmp_path / "m.gguf", copy)
    found = find_source(str(copy))
    assert found.ready and found.load_from == first.load_from  # was renamed-<sha>: converted a second time
    assert prepare_source(str(copy)).load_from == first.load_from
    assert conversions == ["m.gguf"]


@pytest.mark.parametrize("damage", ["truncate", "no-weights", "no-tokenizer", "bad-config"])
def test_a_damaged_conversion_is_made_again_not_loaded(tmp_path, conversions, damage, capsys):
    path = write_model_gguf(tmp_path / "m.gguf")
    target = Path(prepare_source(str(path)).load_from)
    weights = target / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "no-weights":
        weights.unlink()
    elif damage == "no-tokenizer":
        (target / "tokenizer.json").unlink()
    else:
        (target / "config.json").write_text("{not json")
    assert not find_source(str(path)).ready  # was ready: transformers then failed with a traceback
    capsys.readouterr()
    again = prepare_source(str(path))
    assert again.ready and Path(again.load_from) == target and conversions == ["m.gguf", "m.gguf"]
    assert f"the converted copy {target} is damaged" in capsys.readouterr().err
    assert sources._converted_problem(target) is None
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # nothing set aside is left


def test_the_gguf_readers_bar_is_off_while_converting_and_restored(tmp_path, monkeypatch, capsys):
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm

    def convert(gguf_path, out, arch):
        for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        whole_folder(out)

    monkeypatch.setattr(sources, "_convert", convert)
    prepare_source(str(write_model_gguf(tmp_path / "m.gguf")), notify=lambda line: None)
    assert "de-quantizing" not in capsys.readouterr().err
    assert gguf_utils.tqdm is bar


def test_models_get_interrupted_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(name, notify=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(sources, "find_source", lambda name: None)
    monkeypatch.setattr(sources, "prepare_source", interrupted)
    assert main(["models", "get", "smollm2-135m"]) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("kvlab models: error: interrupted: smollm2-135m is not ready")


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_model_is_refused_naming_it(empty, capsys):
    with pytest.raises(ValueError, match=rf"model {empty!r} is empty"):
        check_local_model(empty)
    for argv in (["lab", "--real", "--model", empty], ["inspect", "--model", empty]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"model {empty!r} is empty" in err[0]


def test_an_offline_hub_id_not_in_the_cache_is_bad_input(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="HF_HUB_OFFLINE is set"):
        check_local_model("kvlab-test-owner/no-such-model")
    for argv in (
        ["lab", "--real", "--model", "kvlab-test-owner/no-such-model"],
        ["bench", "memory", "--quick", "--no-save", "--model", "kvlab-test-owner/no-such-model"],
    ):
        assert main(argv) == 2  # was 1 (bench: a traceback), after the loader's retries
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the hub cannot be reached (HF_HUB_OFFLINE is set)" in err[0]


def test_an_offline_near_miss_of_a_named_model_names_it(monkeypatch, capsys):
    # `--model smollm2` offline was refused with "pass a local model directory" only: nothing said that kvlab knows
    # smollm2-135m by name, nor that a GGUF file would do
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"did you mean --model smollm2-135m\? .*a GGUF file or a named model"):
        check_local_model("smollm2")
    assert main(["inspect", "--model", "SmolLM2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean --model smollm2-135m?" in err[0] and "`kvlab models`" in err[0]
    with pytest.raises(OSError) as far:
        check_local_model("kvlab-test-owner/no-such-model")
    assert "did you mean" not in str(far.value) and "smollm2-135m" in str(far.value)


def test_models_get_into_an_unwritable_cache_names_the_folder_and_the_setting(monkeypatch, capsys):
    """XDG_CACHE_HOME=/proc/nope printed only "[Errno 2] No such file or directory: '/proc/nope'": now the folder
    converted models go to and the variable that moves it."""
    import errno

    def unwritable(name, notify=None):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/proc/nope")

    monkeypatch.setenv("KVLAB_MODEL_DIR", "/proc/nope/models")
    monkeypatch.setattr(sources, "find_source", lambda name: None)
    monkeypatch.setattr(sources, "prepare_source", unwritable)
    assert main(["models", "get", "smollm2-135m"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "'/proc/nope'; converted models go to /proc/nope/models ($KVLAB_MODEL_DIR" in err
    assert "set KVLAB_MODEL_DIR to a writable folder" in err

    def missing(name, notify=None):  # kvlab's own message: no hint about folders
        raise FileNotFoundError("the package's model file is missing; reinstall it")

    monkeypatch.setattr(sources, "prepare_source", missing)
    assert main(["models", "get", "smollm2-135m"]) == 1
    err = capsys.readouterr().err
    assert "reinstall it" in err and "KVLAB_MODEL_DIR" not in err
