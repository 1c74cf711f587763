"""The accounting walks an operator's nested arguments and outputs itself (no pytree): tensors inside lists,
tuples and dicts are all counted, in order, and everything else is skipped."""

import torch

from kvlab.runtime.tensor_bytes import TensorBytesTracker


def test_tensors_in_nested_containers_are_found_in_order():
    a, b, c = torch.zeros(3), torch.zeros(5), torch.zeros(7)
    found = TensorBytesTracker._storages(((a, [b, {"x": c, "n": 3}]), {"k": None, "s": "text"}))
    assert [s.nbytes() for s in found] == [12, 20, 28]
    assert TensorBytesTracker._storages((1, 2.0, None, "x", torch.float32)) == []


def test_a_list_input_and_a_tuple_output_are_both_tracked():
    a, b = torch.ones(256), torch.ones(256)  # created before the block: not counted until freed
    with TensorBytesTracker() as tracker:
        joined = torch.cat([a, b])  # a list argument: 2 KiB created
        values, indices = torch.topk(joined, 8)  # a tuple output: 32 + 64 bytes created
    assert tracker.allocated_bytes == 512 * 4 + 8 * 4 + 8 * 8
    assert tracker.allocated_by_op["aten.cat"] == 2048
    assert tracker.allocated_by_op["aten.topk"] == 96
    del joined, values, indices
    assert tracker.current_bytes == 0, "the counters follow frees after the block"
