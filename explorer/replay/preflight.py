"""What is checked before a replay runs anything, so that a materialization fails whole or not at all."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import DeferredInitError, MaterializationError
from ..graph import InitGraph, OpIndex, TensorId
from ..naming import dtype_name
from ..record.checkpoint_formats import READ_DCP, READ_TORCH
from ..record.checkpoint_reads import READ_SAFETENSORS
from ..record.fake import DeferredHandle, handle_of
from ..record.file_stamps import file_stamp
from .routing import DeviceRouting, describe_absence, is_available

FILE_READS = frozenset({READ_SAFETENSORS, READ_TORCH, READ_DCP})


def describe_external(graph: InitGraph, index: int) -> str:
    dtype, shape, device = graph.externals[index].described()
    return f"external tensor {dtype_name(dtype)}{list(shape)} on {device}"


def target_names(names: dict[TensorId, str], tids: Sequence[TensorId]) -> str:
    """The first three targets of a call by name, for error messages."""
    shown = [names.get(tid, f"tensor #{tid}") for tid in tids[:3]]
    return ", ".join(repr(n) for n in shown) + (f" and {len(tids) - 3} more" if len(tids) > 3 else "")


def needing(graph: InitGraph, tids: Sequence[TensorId], ops: set[OpIndex]) -> list[TensorId]:
    """The targets among `tids` whose value needs one of `ops` (for a refusal's message: the
    tensors it is about, not every tensor of the call)."""
    needing = [tid for tid in dict.fromkeys(tids) if ops & set(graph.closure_of([tid], skip_dead_writes=True))]
    return needing or list(tids)


def refuse_changed_files(
    graph: InitGraph, ops: Sequence[OpIndex], tids: Sequence[TensorId], names: dict[TensorId, str]
) -> None:
    """note [A checkpoint changed since recording] in record/file_stamps.py"""
    if not graph.file_stamps:
        return
    seen: set[str] = set()
    for index in ops:
        op = graph.ops[index]
        if op.func not in FILE_READS or op.args[0] in seen:
            continue
        path = op.args[0]
        seen.add(path)
        recorded = graph.file_stamps.get(path)
        if recorded is not None and file_stamp(path) != recorded:
            reads = {i for i in ops if graph.ops[i].func in FILE_READS and graph.ops[i].args[0] == path}
            keys = ", ".join(repr(key) for key in sorted({str(graph.ops[i].args[1]) for i in reads}))
            affected = needing(graph, tids, reads)
            raise MaterializationError(
                f"checkpoint {path} changed since it was recorded (its size, modification time or inode "
                f"differ): {target_names(names, affected)} would be read from bytes the recording never saw "
                f"(key {keys}), "
                "and mixed with what was read before. Record again to read the new file (deferred_init, "
                "load_checkpoint), or put the recorded file back"
            )


def check_replayable(
    graph: InitGraph,
    routing: DeviceRouting,
    ops: Sequence[OpIndex],
    tids: Sequence[TensorId],
    names: dict[TensorId, str],
) -> None:
    """Raise MaterializationError for everything that would make a replay of `ops` (for targets
    `tids`) fail half-way: absent target devices, external tensors changed since recording or not
    checkable, and rng="eager" draws from a generator this machine lacks. Nothing runs before."""
    available: set[torch.device] = set()  # asked once per device: CUDA's answer costs microseconds
    for tid in tids:
        recorded = graph.tensors[tid].device
        target = routing.target(recorded)
        if target in available:
            continue
        if is_available(target):
            available.add(target)
        else:
            raise MaterializationError(
                f"{names.get(tid, f'tensor #{tid}')!r} was recorded on {recorded} and would be "
                f"materialized there, but {describe_absence(target)}; pass device= (e.g. device='cpu' "
                f"or device={{'{recorded.type}': 'cpu'}})"
            )
    refuse_changed_files(graph, ops, tids, names)
    for index in ops:
        op = graph.ops[index]
        for external in op.externals:
            record = graph.externals[external]
            if record.fresh:
                continue
            where = f"{op.label} at {op.source}" if op.source else op.label
            if record.version is None:
                raise MaterializationError(
                    f"the {describe_external(graph, external)} read by {where} is an inference "
                    "tensor: its in-place changes cannot be detected, so its recorded value cannot be "
                    f"trusted (needed for {target_names(names, tids)}); create it outside "
                    "torch.inference_mode()"
                )
            if record.tensor._version != record.version + record.layout_bumps:
                raise MaterializationError(
                    f"the {describe_external(graph, external)} read by {where} was modified in place "
                    f"after deferred_init (version {record.version + record.layout_bumps}, now "
                    f"{record.tensor._version}); "
                    f"{target_names(names, needing(graph, tids, {index}))} cannot be materialized with its "
                    "original value: "
                    "materialize before changing that tensor, or "
                    + (
                        "give the call that read it a clone (a state_dict loaded: {k: v.clone() for k, v in "
                        "state.items()})"
                        if graph.finished and index >= graph.constructor_ops
                        else "pass the constructor a clone of it"
                    )
                )
        if op.stream is not None and routing.rng == "eager":
            key = op.stream[0]
            recorded = torch.device(key)
            if routing.target(recorded).type != "meta" and graph.rng_start.get(key) is None:
                raise MaterializationError(
                    f"rng='eager' draws {op.label} (at {op.source}) from the {key} generator, as eager "
                    f"construction would, but {describe_absence(recorded)}; use rng='fast' for "
                    f"reproducible values that differ from eager, or materialize where {key} exists"
                )


def check_materializable(fake: torch.Tensor, name: str) -> DeferredHandle | None:
    """Refuse what cannot be replayed (an uninitialized lazy parameter, a `.data` set to a real
    tensor), naming it. A `.data = x` made since the fake's last op is recorded first (note
    [Recording after deferred_init]); returns the fake's handle as it is then (None: not deferred),
    which callers must use rather than one read before."""
    if isinstance(fake, nn.parameter.UninitializedTensorMixin):  # type: ignore[attr-defined]  # parameter.pyi omits it
        raise MaterializationError(
            f"{name!r} is an uninitialized lazy parameter: call the module once on an example input "
            "inside module_fn so its shape is known"
        )
    # No version check: every op on a deferred tensor after deferred_init is recorded into its graph
    # (record/extension.py), so an in-place change is part of what replay reproduces.
    handle = handle_of(fake)
    if handle is not None and handle.graph.recorder is not None and handle.graph.finished:
        try:
            handle.graph.recorder.catch_up(fake)
        except DeferredInitError as error:
            raise MaterializationError(f"cannot materialize {name!r}: {error}") from error
    return handle_of(fake)
