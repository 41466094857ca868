"""The short path through fake mode (`lean_fake`) gives exactly FakeTensorMode's metadata.

For every op it short-cuts (factories, views, fills, `lift_fresh`, plain pointwise compute) and every
dtype, the fake it returns must report the same shape, stride, offset, dtype, device, storage size and
requires_grad as the one FakeTensorMode's general path makes; and it must actually take the op (not
hand it back with NotImplemented), or the comparison would be empty.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from explorer.record.checkpoint_reads import READ_SAFETENSORS
from explorer.record.fake import DeferredTensor
from explorer.record.lean_fake import FACTORIES, FILLS, VIEWS, FakeFactory, lean_dispatch

aten = torch.ops.aten
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = (*FLOATS, torch.int32, torch.int64, torch.bool)
DEVICES = ("cpu", "cuda:0")  # a fake "cuda" tensor needs no GPU


@pytest.fixture
def mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


def make_fake(mode: FakeTensorMode, shape: tuple, dtype: torch.dtype, device: str,
              stride: tuple | None = None, offset: int = 0) -> DeferredTensor:
    """A DeferredTensor of this layout, as the recorder makes them."""
    with torch._C._DisableTorchDispatch():
        contiguous = torch.empty(shape, device="meta").stride()
        size = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride or contiguous)) if all(shape) else 0
        base = torch.empty(max(size, 0), dtype=dtype, device="meta")
        meta = base.as_strided(shape, stride or contiguous, offset)
    return FakeFactory(mode)(meta, torch.device(device))


def metadata(tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "shape": tuple(tensor.shape), "stride": tuple(tensor.stride()), "offset": tensor.storage_offset(),
        "dtype": tensor.dtype, "device": tensor.device, "requires_grad": tensor.requires_grad,
        "storage_bytes": tensor.untyped_storage().nbytes(),
    }


def both_paths(mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(lean result, FakeTensorMode result) for the same call."""
    with mode:
        lean = lean_dispatch(mode, FakeFactory(mode), func, args, kwargs)
        reference = func(*args, **kwargs)
    assert lean is not NotImplemented, f"lean_fake did not take {func}"
    return lean, reference


FACTORY_CALLS: list[tuple[Any, Callable[[torch.dtype, torch.device], tuple[tuple, dict]]]] = [
    (aten.empty.memory_format, lambda d, dev: (([2, 3],), {"dtype": d, "device": dev})),
    (aten.empty_strided.default, lambda d, dev: (([2, 3], [1, 2]), {"dtype": d, "device": dev})),
    (aten.zeros.default, lambda d, dev: (([4, 1, 3],), {"dtype": d, "device": dev})),
    (aten.ones.default, lambda d, dev: (([5],), {"dtype": d, "device": dev})),
    (aten.full.default, lambda d, dev: (([2, 2], 1), {"dtype": d, "device": dev})),
    (aten.arange.default, lambda d, dev: ((7,), {"dtype": d, "device": dev})),
    (aten.arange.start, lambda d, dev: ((2, 9), {"dtype": d, "device": dev})),
    (aten.arange.start_step, lambda d, dev: ((0, 10, 3), {"dtype": d, "device": dev})),
    (aten.linspace.default, lambda d, dev: ((0, 1, 5), {"dtype": d, "device": dev})),
    # a checkpoint read, registered by record/checkpoint_reads.py (register_factory): no file is opened
    (READ_SAFETENSORS, lambda d, dev: (("/nonexistent/model.safetensors", "w", [4, 3], d), {"device": dev})),
]


def test_every_factory_the_short_path_takes_is_covered_here() -> None:
    assert {func for func, _ in FACTORY_CALLS} == set(FACTORIES)
    assert {func for func, _ in VIEW_CALLS} == set(VIEWS)
    assert {func for func, _ in FILL_CALLS} == set(FILLS)


RANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step, aten.linspace.default)
FACTORY_CASES = [
    pytest.param(func, call, dtype, id=f"{func}-{dtype}")
    for func, call in FACTORY_CALLS for dtype in DTYPES
    if not (dtype is torch.bool and func in RANGES)  # torch has no bool ranges, eager refuses them too
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("func,call,dtype", FACTORY_CASES)
def test_factory_metadata_equals_fake_tensor_mode(mode, func, call, dtype, device) -> None:
    args, kwargs = call(dtype, torch.device(device))
    lean, reference = both_paths(mode, func, args, kwargs)
    assert type(lean) is DeferredTensor
    assert metadata(lean) == metadata(reference)


VIEW_CALLS: list[tuple[Any, Callable[[torch.Tensor], tuple]]] = [  # each given a (2, 3, 4) tensor
    (aten.detach.default, lambda x: (x,)),
    (aten.alias.default, lambda x: (x,)),
    (aten.view.default, lambda x: (x, [6, 4])),
    (aten.t.default, None),  # wants a matrix: given a (3, 4) tensor
    (aten.transpose.int, lambda x: (x, 0, 2)),
    (aten.permute.default, lambda x: (x, [2, 0, 1])),
    (aten.unsqueeze.default, lambda x: (x, 1)),
    (aten.expand.default, lambda x: (x, [5, 2, 3, 4])),
    (aten.as_strided.default, lambda x: (x, [3, 2], [2, 5], 1)),
    (aten.select.int, lambda x: (x, 1, 2)),
    (aten.slice.Tensor, lambda x: (x, 2, 1, 4, 2)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("func,call", VIEW_CALLS, ids=str)
def test_view_metadata_equals_fake_tensor_mode(mode, func, call, dtype, device) -> None:
    if call is None:
        args = (make_fake(mode, (3, 4), dtype, device),)
    else:
        args = call(make_fake(mode, (2, 3, 4), dtype, device))
    lean, reference = both_paths(mode, func, args, {})
    assert metadata(lean) == metadata(reference)


def test_view_of_a_transposed_offset_tensor_keeps_its_layout(mode) -> None:
    base = make_fake(mode, (4, 3), torch.float32, "cpu", stride=(1, 4), offset=2)
    lean, reference = both_paths(mode, aten.slice.Tensor, (base, 0, 1, 3), {})
    assert metadata(lean) == metadata(reference)
    assert metadata(lean)["offset"] == 3


FILL_CALLS: list[tuple[Any, Callable[[torch.Tensor, torch.Tensor], tuple]]] = [
    (aten.fill_.Scalar, lambda x, y: (x, 1)),
    (aten.zero_.default, lambda x, y: (x,)),
    (aten.copy_.default, lambda x, y: (x, y)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("func,call", FILL_CALLS, ids=str)
def test_fill_returns_its_target_with_unchanged_metadata(mode, func, call, dtype, device) -> None:
    target = make_fake(mode, (3, 4), dtype, device, stride=(1, 3))
    source = make_fake(mode, (3, 4), dtype, device)
    before = metadata(target)
    lean, reference = both_paths(mode, func, call(target, source), {})
    assert lean is target and reference is target
    assert metadata(lean) == before


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lift_fresh_of_a_constant_is_a_cpu_fake_of_its_layout(mode, dtype) -> None:
    constant = torch.zeros(2, 5, dtype=dtype)
    lean, reference = both_paths(mode, aten.lift_fresh.default, (constant,), {})
    assert metadata(lean) == metadata(reference)


COMPUTE_CALLS: list[tuple[Any, Callable[[torch.Tensor, torch.Tensor], tuple]]] = [
    (aten.add.Tensor, lambda x, y: (x, y)),
    (aten.mul.Tensor, lambda x, y: (x, y)),
    (aten.div.Tensor, lambda x, y: (x, y)),
    (aten.pow.Tensor_Scalar, lambda x, y: (x, 2)),
    (aten.reciprocal.default, lambda x, y: (x,)),
    (aten.neg.default, lambda x, y: (x,)),
    (aten.clone.default, lambda x, y: (x,)),
    (aten.sin.default, lambda x, y: (x,)),
]


@pytest.mark.parametrize("size", [(3, 4), (300, 300)], ids=["small", "large"])  # large: meta kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("func,call", COMPUTE_CALLS, ids=str)
def test_pointwise_compute_metadata_equals_fake_tensor_mode(mode, func, call, dtype, device, size) -> None:
    rows, cols = size
    x = make_fake(mode, size, dtype, device, stride=(1, rows))  # transposed: layout must follow it
    y = make_fake(mode, (1, cols), dtype, device)  # broadcast
    lean, reference = both_paths(mode, func, call(x, y), {})
    assert metadata(lean) == metadata(reference)


def _join_inputs(mode: FakeTensorMode, case: str, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    if case == "contiguous":
        return [make_fake(mode, (4, 6), dtype, device) for _ in range(5)]
    if case == "vectors":
        return [make_fake(mode, (5,), dtype, device) for _ in range(4)]
    if case == "three_d":
        return [make_fake(mode, (2, 3, 4), dtype, device) for _ in range(3)]
    if case == "zero_size":
        return [make_fake(mode, (0, 6), dtype, device) for _ in range(2)]
    if case == "transposed":  # eager keeps the inputs' layout when all share it
        return [make_fake(mode, (4, 6), dtype, device, stride=(1, 4)) for _ in range(3)]
    if case == "channels_last":
        return [make_fake(mode, (2, 3, 4, 5), dtype, device, stride=(60, 1, 15, 3)) for _ in range(2)]
    if case == "mixed_layouts":
        return [make_fake(mode, (4, 6), dtype, device), make_fake(mode, (4, 6), dtype, device, stride=(1, 4))]
    if case == "offset_views":
        return [make_fake(mode, (4, 6), dtype, device, offset=7), make_fake(mode, (4, 6), dtype, device, offset=2)]
    if case == "legacy_empty":  # cat skips 1-D empty tensors of any other shape
        return [make_fake(mode, (4, 6), dtype, device), make_fake(mode, (0,), dtype, device)]
    if case == "promoted":
        return [make_fake(mode, (4, 6), dtype, device), make_fake(mode, (4, 6), torch.float64, device)]
    raise AssertionError(case)


JOIN_CASES = ("vectors", "three_d", "zero_size", "contiguous", "transposed", "channels_last", "mixed_layouts", "offset_views", "legacy_empty", "promoted")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32, torch.int64), ids=str)
@pytest.mark.parametrize("case", JOIN_CASES)
@pytest.mark.parametrize("func", [aten.cat.default, aten.stack.default], ids=str)
def test_cat_and_stack_metadata_equal_fake_tensor_mode(mode, func, case, dtype, device) -> None:
    tensors = _join_inputs(mode, case, dtype, device)
    if func is aten.stack.default and case == "legacy_empty":
        tensors = tensors[:1]
    highest = tensors[0].dim() if func is aten.stack.default else tensors[0].dim() - 1
    for dim in ([], *([d] for d in (1, -1, highest) if d <= highest)):
        lean, reference = both_paths(mode, func, (tensors, *dim), {})
        assert metadata(lean) == metadata(reference), dim


def test_cat_errors_are_eagers_and_mixed_devices_are_handed_back(mode) -> None:
    make = FakeFactory(mode)
    a, b = make_fake(mode, (4, 6), torch.float32, "cpu"), make_fake(mode, (5, 7), torch.float32, "cpu")
    with mode, pytest.raises(RuntimeError, match="Sizes of tensors must match except in dimension 0"):
        lean_dispatch(mode, make, aten.cat.default, ([a, b],), {})
    cuda = make_fake(mode, (4, 6), torch.float32, "cuda:0")
    with mode:
        assert lean_dispatch(mode, make, aten.cat.default, ([a, cuda],), {}) is NotImplemented
        assert lean_dispatch(mode, make, aten.stack.default, ([a, torch.ones(4, 6)],), {}) is NotImplemented
        assert lean_dispatch(mode, make, aten.cat.default, ([],), {}) is NotImplemented
        # stack's own checks are FakeTensorMode's to raise, in eager's words
        assert lean_dispatch(mode, make, aten.stack.default, ([a, b],), {}) is NotImplemented
        assert lean_dispatch(mode, make, aten.stack.default, ([a, a], 3), {}) is NotImplemented


def test_ops_it_cannot_answer_are_handed_back(mode) -> None:
    make = FakeFactory(mode)
    cpu = make_fake(mode, (3,), torch.float32, "cpu")
    cuda = make_fake(mode, (3,), torch.float32, "cuda:0")
    with mode:
        assert lean_dispatch(mode, make, aten.add.Tensor, (cpu, cuda), {}) is NotImplemented  # two devices
        assert lean_dispatch(mode, make, aten.mm.default, (cpu, cpu), {}) is NotImplemented  # not pointwise
        assert lean_dispatch(mode, make, aten.view.default, (torch.ones(3), [3]), {}) is NotImplemented  # real
        assert lean_dispatch(mode, make, aten.ones.default, ([2],), {"device": torch.device("meta")}) is NotImplemented
