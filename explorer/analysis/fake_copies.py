"""Fake tensors of a FakeTensorMode of our own, made from metadata alone (no data is ever read).

The dry run and the FX export both need fakes that are not the recording's (those belong to the
deferred module and must not change) yet alias one another as the originals do: each storage
becomes one meta byte buffer, and each tensor a view of it with the original layout.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

import torch

from .._torch_compat.fake import FakeTensor, FakeTensorMode
from ..naming import byte_span


def layout_extent(shape: Sequence[int], stride: Sequence[int], offset: int, itemsize: int) -> int:
    """Bytes from the start of the storage to the end of the last element a layout reaches."""
    return byte_span(shape, stride, offset, itemsize)[1]


class FakeCopies:
    """Makes fakes of `mode` over shared fake storages, one per storage key."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self._storages: dict[Hashable, torch.Tensor] = {}

    def storage(self, key: Hashable, nbytes: int) -> None:
        """Declare storage `key` with `nbytes` bytes (before making tensors on it)."""
        if key not in self._storages:
            self._storages[key] = torch.empty(nbytes, dtype=torch.uint8, device="meta")

    def tensor(
        self,
        key: Hashable,
        shape: Sequence[int],
        stride: Sequence[int],
        offset: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> FakeTensor:
        """A fake on `device` with this layout over storage `key`."""
        base = self._storages[key]
        meta = torch.empty(0, dtype=dtype, device="meta").set_(base.untyped_storage(), offset, shape, stride)
        return self.mode.fake_tensor_converter.from_meta_and_device(self.mode, meta, device)

    def like(self, key: Hashable, tensor: torch.Tensor) -> FakeTensor:
        """A fake with `tensor`'s layout, dtype and device over storage `key`."""
        offset = cast(int, tensor.storage_offset())  # no ShapeEnv here: offsets are ints; torch's hint allows a SymInt
        return self.tensor(key, tensor.shape, tensor.stride(), offset, tensor.dtype, tensor.device)
