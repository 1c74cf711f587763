"""``kvlab plan --weights-index``: an index or safetensors header that cannot be the checkpoint's bytes is refused
naming the file and the field, not read as 0 B or a fractional byte count (a wrong decode bound)."""

from __future__ import annotations

import json
import struct

import pytest

from kvlab.cli import main


def _refused(capsys, path) -> str:
    assert main(["plan", "llama-3-8b", "--weights-index", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize("size", [0, 1.5, -3, "12"])
def test_an_index_total_size_that_is_not_whole_bytes_is_refused(size, tmp_path, capsys):
    """total_size 0 gave weights 0 B and a decode bound of the KV alone; 1.5 was accepted."""
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {"total_size": size}}))
    err = _refused(capsys, path)
    assert f"{path} has no `metadata.total_size` (a whole number of bytes >= 1), got {size!r}" in err


def _file(tmp_path, tensors: dict, data: int):
    blob = json.dumps(tensors).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(data))
    return path


@pytest.mark.parametrize(
    "tensor, data, said",
    [
        ({"dtype": "F16", "shape": [-2, 4], "data_offsets": [0, 16]}, 16, "has no valid `shape` (whole numbers >= 0), got [-2, 4]"),
        ({"dtype": "Q99", "shape": [2], "data_offsets": [0, 4]}, 4, "has `dtype` 'Q99', not a safetensors dtype kvlab sizes (F64,"),
        ({"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}, 2, "`data_offsets` [0, 4] end past the file's 2 B of tensor data"),
        ({"dtype": "F16", "shape": [8], "data_offsets": [0, 4]}, 4, "`data_offsets` [0, 4] hold 4 B, but `shape` [8] of F16 is 16 B"),
        ({"dtype": "F16", "shape": [0], "data_offsets": [0, 0]}, 0, "its safetensors headers hold 0 B of tensors"),
    ],
)  # fmt: skip
def test_a_safetensors_header_inconsistent_with_its_file_is_refused(tensor, data, said, tmp_path, capsys):
    """A negative shape, an unknown dtype, offsets past the end of the file were accepted as weight bytes."""
    path = _file(tmp_path, {"w": tensor}, data)
    err = _refused(capsys, path)
    assert str(path) in err and said in err


def test_a_consistent_header_gives_its_bytes(tmp_path, capsys):
    path = _file(tmp_path, {"w": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]}}, 24)
    assert main(["plan", "llama-3-8b", "--weights-index", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == 24


@pytest.mark.parametrize(
    "second, first_named",
    [
        ([8, 24], "'a' (`data_offsets` [0, 16]) and 'b' (`data_offsets` [8, 24])"),  # a tail shared
        ([0, 16], "'a' (`data_offsets` [0, 16]) and 'b' (`data_offsets` [0, 16])"),  # the same bytes twice
        ([4, 12], "'a' (`data_offsets` [0, 16]) and 'b' (`data_offsets` [4, 12])"),  # inside another
    ],
)
def test_tensors_whose_offsets_overlap_are_refused_naming_both(second, first_named, tmp_path, capsys):
    """Two tensors over the same bytes were summed: 32 B of weights from a file with 24 B of tensor data."""
    b = {"dtype": "F16", "shape": [(second[1] - second[0]) // 2], "data_offsets": second}
    path = _file(tmp_path, {"a": {"dtype": "F16", "shape": [8], "data_offsets": [0, 16]}, "b": b}, 24)
    err = _refused(capsys, path)
    assert f"{path}: tensors {first_named} overlap: each byte of the data belongs to one tensor" in err


def test_tensors_side_by_side_and_empty_ones_are_not_overlaps(tmp_path, capsys):
    tensors = {
        "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},  # the header's order is not the data's
        "a": {"dtype": "F16", "shape": [8], "data_offsets": [0, 16]},
        "e": {"dtype": "F16", "shape": [0], "data_offsets": [8, 8]},  # no bytes: overlaps nothing
    }
    assert main(["plan", "llama-3-8b", "--weights-index", str(_file(tmp_path, tensors, 24)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == 24
