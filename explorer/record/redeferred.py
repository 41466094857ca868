"""A materialized tensor given deferred data inside `with deferred(model):`.

Note: [A materialized tensor given deferred data]
Code run in the block may point a *real* tensor of the model at a deferred one's memory:
`old.weight.data = new.weight.data` ends transformers' `resize_token_embeddings` (and PEFT's safe
merge), and `old` is real when that module was materialized before the block. The swap happens in
C++, unseen by the recorder: the real parameter is left holding the fake's meta storage, neither
real nor deferred; `materialize_module` skipped it and a forward could crash the interpreter. In
eager the parameter now holds the new values. So at the end of the block every real tensor of the
model whose storage is one of the recording's is put back as a deferred tensor with that layout (an
alias of the storage, recorded), in every place the model holds it (ties included), as a
parameter if it was one, with its `requires_grad` and the attributes set on it. Materializing it
then gives eager's values, and as for every materialization, a new tensor object.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._torch_compat.dispatch import disable_torch_dispatch
from .._torch_compat.fake import FakeTensor
from .builder import GraphBuilder
from .lean_fake import FakeFactory


def redefer_swapped_tensors(builder: GraphBuilder, make_fake: FakeFactory, roots: list[nn.Module]) -> int:
    """Replace each real parameter or buffer of `roots` that points at a storage of `builder`'s
    recording with a deferred one (note above). Call inside the block's recording; returns how many."""
    places: dict[int, tuple[torch.Tensor, list[tuple[dict, str]]]] = {}
    for root in roots:
        for module in root.modules():
            for store in (module._parameters, module._buffers):
                for name, tensor in store.items():
                    if tensor is not None and not isinstance(tensor, FakeTensor) and builder.records_storage_of(tensor):
                        places.setdefault(id(tensor), (tensor, []))[1].append((store, name))
    for tensor, where in places.values():
        replacement = _deferred_like(builder, make_fake, tensor)
        for store, name in where:
            store[name] = replacement
    return len(places)


def _deferred_like(builder: GraphBuilder, make_fake: FakeFactory, tensor: torch.Tensor) -> Any:
    with disable_torch_dispatch():
        fake = make_fake(tensor.detach(), builder.recorded_device_of(tensor), False)
    builder.id_of(fake, None)  # recorded as an alias of the storage
    replacement: torch.Tensor = fake
    if isinstance(tensor, nn.Parameter):
        replacement = nn.Parameter(fake, requires_grad=tensor.requires_grad)  # a recorded detach
    replacement.__dict__.update(tensor.__dict__)  # what a user or library set on it
    return replacement
