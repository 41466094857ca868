"""`train_step`: will it train? One forward, backward and optimizer step on fake tensors, measured.

The step is the loop users write (note [The loop as users write it]): the output and the loss are
kept through the optimizer step unless asked otherwise, with gradient accumulation and
`zero_grad(set_to_none=True)`.
The step runs on a fake twin of the module (`train_twin.fake_twin`: the module tree deep-copied
with every tensor replaced by a fake of a FakeTensorMode of our own), so the module, its recording
and the global RNG are left as they were and no storage is allocated; with `world_size > 1` the
twin is sharded with FSDP2 over a fake process group (`fake_fsdp`). Memory is counted by PyTorch's
own trackers, made fast (`memory_tracker`, note [Fast memory trackers]): bytes per category at the
peak, and per module the peak in forward and backward; and what is alive at the end of forward, when
backward starts (where activations are at their most): bytes by category, and the activations by
the module whose forward created them. The numbers are those `MemTracker` /
`FSDPMemTracker` report for the same step of the eager model (tests compare them byte for byte):
tensor storages only, rounded to the CUDA allocator's 512-byte blocks on CUDA devices; no allocator
fragmentation, CUDA context or kernel workspaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import CheckpointError

from .._torch_compat.distributed import CheckpointWrapper
from .._torch_compat.fake import FakeTensorMode, unset_fake_temporarily
from .._torch_compat.memory_tracker import (
    FastFSDPMemTracker,
    FastMemTracker,
    FastTracker,
    MemTracker,
    PartKey,
    activations_by_owner,
    bytes_by_part,
    current_snapshot,
    innermost_module,
)
from ..record.scope import recording_graph
from .cpu_fake_mode import CpuFakeTensorMode
from .dry_run import fake_forward_arguments, tensor_leaves
from .fake_fsdp import (
    checkpoint_blocks,
    fake_process_group,
    lazy_fsdp_chunks,
    repeated_blocks,
    shard_blocks,
)
from .module_parts import ModuleParts, module_parts, nested, split_by_part
from .running_modules import RunningModules
from .train_budget import parse_budget
from .train_modules import block_peak_snapshots, forward_activation_table, module_table
from .train_render import summary_text, train_step_html, verdict_text
from .train_twin import fake_twin

Category = Literal[
    "parameters",
    "sharded_parameters",
    "unsharded_parameters",
    "buffers",
    "gradients",
    "sharded_gradients",
    "unsharded_gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "all_gather",
    "reduce_scatter",
    "inputs",
]
Phase = Literal["forward", "backward", "optimizer"]

# PyTorch's category names (`_MemRefType` / `_FSDPRefType` values) → ours.
CATEGORY_OF: dict[str, Category] = {
    "Parameter": "parameters",
    "Sharded Param": "sharded_parameters",
    "Unsharded Param": "unsharded_parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Sharded Grad": "sharded_gradients",
    "Unsharded Grad": "unsharded_gradients",
    "Optstate": "optimizer_state",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "Other": "inputs",
    "Inputs": "inputs",
}
SINGLE_CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
)
FSDP_CATEGORIES: tuple[Category, ...] = (
    "sharded_parameters",
    "unsharded_parameters",
    "buffers",
    "sharded_gradients",
    "unsharded_gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "all_gather",
    "reduce_scatter",
    "inputs",
)
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
LossFunction = Callable[[Any], torch.Tensor]
# One moment's memory: the bytes alive, those bytes by category, and by (part, category)
# (`module_parts`, note [Bytes by part]).
Breakdown = tuple[int, dict[str, int], dict[tuple[str, str], int]]


class TrainStepError(RuntimeError):
    """The training step could not run on fake tensors (names the phase and the running modules)."""


@dataclass(frozen=True, repr=False)
class TrainStep:
    """What one fake training step needs in memory, per device (per rank when `world_size > 1`).

    `peak_bytes`: the most bytes alive at once; `peak`: those bytes by category at that moment
    (`SINGLE_CATEGORIES`, or `FSDP_CATEGORIES` when sharded); `phase`: the phase the peak was
    reached in; `phase_peaks`: the running peak at the end of each phase (of its last micro-batch);
    `modules`: one row per module that ran (`train_modules.MODULE_COLUMNS`; with FSDP, the sharded
    modules). `peak_by_module`: the peak's bytes by part of the model and category (`module_parts`:
    the top-level modules, the repeated blocks as one part; note [Bytes by part]), adding up to
    `peak_bytes`. `phase_own_peaks`: per phase, the most bytes alive while it alone ran, by category
    and by (part, category) (a `Breakdown`); `block_peaks`: per (repeated block path, "forward" or
    "backward"), the `Breakdown` of the most bytes alive while that pass of the block ran (what
    `plan_parallel` composes across block counts).
    `end_of_forward_bytes`: the bytes alive when forward (and the loss) is done and backward starts,
    the moment activations are at their most; `end_of_forward`: those bytes by category;
    `end_of_forward_activations`: its activations by the module whose own forward code created them
    (`train_modules.FORWARD_ACTIVATION_COLUMNS`, rows adding up to `end_of_forward["activations"]`;
    ops outside every module as `train_modules.OUTSIDE_MODULES`). `device`: the
    device the parameters are on; `blocks`: the repeated blocks found (what checkpointing wraps and
    the default sharding shards). `keep_outputs`, `accumulation_steps`: the loop that was measured
    (`TrainingLoop`); with several micro-batches, the end of forward is the last one's.
    """

    root_class: str
    world_size: int
    optimizer: str
    activation_checkpointing: bool
    peak_bytes: int
    peak: dict[str, int]
    phase: Phase
    phase_peaks: dict[str, int]
    modules: pd.DataFrame
    end_of_forward_bytes: int
    end_of_forward: dict[str, int]
    end_of_forward_activations: pd.DataFrame
    device: str = "cpu"
    blocks: list[str] = field(default_factory=list)
    keep_outputs: bool = True
    accumulation_steps: int = 1
    phase_own_peaks: dict[str, Breakdown] = field(default_factory=dict)
    block_peaks: dict[tuple[str, str], Breakdown] = field(default_factory=dict)
    peak_by_module: dict[str, dict[str, int]] = field(default_factory=dict)

    def fits(self, budget: float | str) -> bool:
        """Whether the peak fits in `budget` bytes per device: a number of bytes, or a string such as
        "80GB" (10^9 bytes), "80GiB" (2^30), "512 MiB". Raises ValueError for an unreadable budget."""
        return self.peak_bytes <= parse_budget(budget)

    def verdict(self, budget: float | str) -> str:
        """'fits on N × budget' or 'does not fit on N × budget', with the peak per device."""
        return verdict_text(self, budget)

    def summary(self) -> str:
        """The peak, the phase it is reached in, and each non-empty category, one per line; then the
        same for the end of forward."""
        return summary_text(self)

    def _repr_html_(self) -> str:
        """Rich display in notebooks: headline, stacked bar by category, per-module table; then the
        end of forward: headline, stacked bar, activations by module."""
        return train_step_html(self)

    def __repr__(self) -> str:
        return self.summary()


# -- the step --------------------------------------------------------------------------------------


def default_loss(output: Any) -> torch.Tensor:
    """The model's own loss when its output carries one (a `loss` key or attribute that is a tensor,
    as Hugging Face models return when given `labels=`), otherwise the sum of every floating-point
    output tensor that requires grad. Raises TrainStepError when there is none."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        leaves = [output]
    else:
        leaves = [t for t in tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    if not leaves or not leaves[0].requires_grad:
        raise TrainStepError(
            f"the forward returned no tensor that requires grad (got {type(output).__name__}): pass loss=..."
        )
    total = leaves[0].sum()
    for leaf in leaves[1:]:
        total = total + leaf.sum()
    return total


@dataclass(frozen=True)
class TrainingLoop:
    """The loop `train_step` runs, as users write it (see note [The loop as users write it]).

    `keep_outputs`: the forward's output and the loss stay referenced until after the optimizer
    step, as `out = model(...)` in a loop keeps them (False: `del out, loss` right after backward);
    `accumulation_steps`: forwards and backwards, each on the same inputs, before one optimizer step.
    """

    keep_outputs: bool = True
    accumulation_steps: int = 1


# Note: [The loop as users write it]
# `train_step` runs, and measures, this loop; the names a loop keeps alive are part of its memory:
#
#     for _ in range(accumulation_steps):
#         out = model(*inputs)                         # the previous `out` is freed only now
#         loss = loss_fn(out) / accumulation_steps     # no division when accumulation_steps == 1
#         loss.backward()
#         # keep_outputs=False: del out, loss
#     optimizer.step()
#     optimizer.zero_grad(set_to_none=True)
#
# With the outputs kept, a causal LM's logits (and its KV cache when it returns one) are alive
# through the optimizer step: `batch × sequence × vocabulary` floats on top of the moments.


@dataclass
class _StepRun:
    """What running the step produced: the tracker, the phase running (or failed in), the running
    peak after each phase and the phase it was reached in, and the end of forward of the last
    micro-batch: the current snapshot of the device holding most (category → bytes, "Total") and
    its activations by the module that created them (`activations_by_owner`)."""

    tracker: FastTracker
    optimizer_name: str
    phase: Phase = "forward"
    peak_phase: Phase = "forward"
    phase_peaks: dict[str, int] = field(default_factory=dict)
    end_of_forward: dict = field(default_factory=dict)
    end_of_forward_owners: dict[str | None, int] = field(default_factory=dict)
    phase_own_peaks: dict[str, dict] = field(default_factory=dict)
    parts: ModuleParts | None = None

    def take_end_of_forward(self) -> None:
        device, snapshot = current_snapshot(self.tracker)
        self.end_of_forward = dict(snapshot)
        self.end_of_forward_owners = activations_by_owner(self.tracker, device) if device is not None else {}

    def finish(self, phase: Phase, then: Phase | None = None) -> None:
        """`phase` is done (`then` starts): its running peak, whether it raised the peak, and its own
        peak (the most bytes alive while it ran: the largest over micro-batches)."""
        own = max(self.tracker.window_peak().values(), key=lambda snap: snap["Total"], default={})
        if own and own["Total"] > self.phase_own_peaks.get(phase, {}).get("Total", -1):
            self.phase_own_peaks[phase] = own
        self.tracker.start_window()
        peak = _peak_total(self.tracker)
        if peak > max(self.phase_peaks.values(), default=0):
            self.peak_phase = phase
        self.phase_peaks[phase] = peak
        self.phase = then or phase


def _peak_total(tracker: MemTracker) -> int:
    snapshot = tracker.get_tracker_snapshot("peak")
    return max((device_snap["Total"] for device_snap in snapshot.values()), default=0)


def _running(tracker: MemTracker, twin: nn.Module, running: RunningModules) -> str:
    """The innermost module running when the step failed, as its path and class ("layers.0.mlp
    (LlamaMLP)"), `<root> (Class)` for the root and `no module` outside every module: where an op
    raised, else where Python code raised (analysis/running_modules.py)."""
    name = getattr(tracker, "failed_in", None) or innermost_module(tracker._mod_tracker)
    if name is None:
        left = running.innermost()
        if left is None:
            return "no module"
        path, module = left
        return f"{path or '<root>'} ({type(module).__name__})"
    path = name.partition(".")[2]  # ModTracker names modules "<root class>.<path>"
    try:
        return f"{path or '<root>'} ({type(twin.get_submodule(path)).__name__})"
    except AttributeError:  # renamed since the hooks ran: the tracker's name is all there is
        return name


def _scaled(value: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    return value / accumulation_steps if accumulation_steps > 1 else value


def _run_loop(
    run: _StepRun,
    twin: nn.Module,
    args: tuple,
    kwargs: dict,
    optimizer: torch.optim.Optimizer,
    loss: LossFunction,
    loop: TrainingLoop,
) -> None:
    """The loop of note [The loop as users write it], line for line, noting each phase in `run`.
    The per-module statistics start afresh with each micro-batch (`reset_mod_stats`, as PyTorch's
    trackers ask): the module table is the last micro-batch's."""
    output: Any = None
    value: Any = None
    for micro_batch in range(loop.accumulation_steps):
        if micro_batch:  # the trackers refuse a second forward of the root otherwise; the step's peak stays
            run.tracker.reset_mod_stats()
        run.phase = "forward"
        run.tracker.start_window()
        output = twin(*args, **kwargs)
        value = _scaled(loss(output), loop.accumulation_steps)
        run.take_end_of_forward()
        run.finish("forward", then="backward")
        value.backward()
        if not loop.keep_outputs:
            output = value = None  # del out, loss
        run.finish("backward")
    run.phase = "optimizer"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    run.finish("optimizer")
    del output, value  # kept until here by default: the end of the loop's body


def run_step(
    twin: nn.Module,
    args: tuple,
    kwargs: dict,
    make_optimizer: OptimizerFactory,
    loss: LossFunction,
    tracker: FastTracker,
    root_class: str,
    loop: TrainingLoop = TrainingLoop(),
) -> _StepRun:
    """`loop` (note [The loop as users write it]) of `twin` under `tracker` (created by the caller:
    `FastMemTracker()` or `FastFSDPMemTracker(twin, optimizer)`), exactly as one would write it in
    eager; inputs are tracked as "inputs" (a tracker's `op_observer` sees every op of the loop).
    Raises TrainStepError naming phase and module."""
    optimizer = getattr(tracker, "_optm", None) or make_optimizer(twin.parameters())
    run = _StepRun(tracker, type(optimizer).__name__)
    run.parts = module_parts(twin)
    split_by_part(tracker, run.parts, [twin], optimizer)
    if isinstance(tracker, FastFSDPMemTracker):
        tracker.track_inputs((args, kwargs))
    else:
        tracker.track_external(twin, optimizer, *tensor_leaves((args, kwargs)))
    running = "no module"
    try:
        with tracker, RunningModules(twin) as forwards:
            try:
                _run_loop(run, twin, args, kwargs, optimizer, loss, loop)
            except Exception:
                running = _running(tracker, twin, forwards)  # leaving the tracker empties its module stack
                raise
    except TrainStepError:
        raise
    except CheckpointError as error:
        raise TrainStepError(
            f"the {run.phase} of {root_class} recomputed a checkpointed block with other shapes than its forward, "
            f"in {running}: the block's forward does not repeat itself, as eager training would find too (a KV "
            "cache that grows at each call does this: pass use_cache=False, as training with activation "
            f"checkpointing needs): CheckpointError: {error}"
        ) from error
    except Exception as error:
        raise TrainStepError(
            f"the {run.phase} of {root_class} cannot run on fake tensors, in {running}"
            f"{_cache_hint(run, twin, kwargs)}: {type(error).__name__}: {error}"
        ) from error
    return run


def _cache_hint(run: _StepRun, twin: nn.Module, kwargs: dict) -> str:
    """For a backward that failed in a model keeping a KV cache: the likely cause, which eager
    training meets too (a checkpointed block recomputed in the backward appends to the cache again,
    and its shapes change), and the fix."""
    config = getattr(twin, "config", None)
    if run.phase != "backward" or kwargs.get("use_cache") is False or not getattr(config, "use_cache", False):
        return ""
    if not any(isinstance(module, CheckpointWrapper) for module in twin.modules()):
        return ""
    return (
        " (the model keeps a KV cache, use_cache=True: if a checkpointed block recomputed in the backward "
        "appended to it again, its shapes changed, as eager training would find too; pass use_cache=False)"
    )


def _peak_snapshot(tracker: MemTracker) -> dict:
    snapshot = tracker.get_tracker_snapshot("peak")
    return max(snapshot.values(), key=lambda snap: snap["Total"]) if snapshot else {}


def _by_category(device_snap: dict, categories: tuple[Category, ...]) -> tuple[int, dict[str, int]]:
    """A device's snapshot as (total, bytes by our category, every one of `categories` present)."""
    if not device_snap:
        return 0, dict.fromkeys(categories, 0)
    peak: dict[str, int] = dict.fromkeys(categories, 0)
    for key, value in device_snap.items():
        if key != "Total" and type(key) is not PartKey:
            peak[CATEGORY_OF[getattr(key, "value", key)]] += value
    return device_snap["Total"], peak


def breakdown(device_snap: dict, categories: tuple[Category, ...]) -> Breakdown:
    """A device's snapshot as a `Breakdown`: total, by our category, by (part, our category)."""
    total, by_category = _by_category(device_snap, categories)
    by_part: dict[tuple[str, str], int] = {}
    for (part, name), value in bytes_by_part(device_snap).items():
        key = (part, CATEGORY_OF[name])
        by_part[key] = by_part.get(key, 0) + value
    return total, by_category, by_part


def _prepare_twin(
    module: nn.Module, mode: FakeTensorMode, activation_checkpointing: bool
) -> tuple[nn.Module, list[str]]:
    twin = fake_twin(module, mode)
    twin.train()
    blocks = repeated_blocks(twin)
    if activation_checkpointing:
        if not blocks:
            raise TrainStepError(
                f"activation_checkpointing=True found no repeated blocks in {type(module).__name__} (entries of an "
                "nn.ModuleList/nn.Sequential with submodules sharing a class): nothing to checkpoint"
            )
        checkpoint_blocks(twin, blocks)
    return twin, [path for path, _ in blocks]


def check_reachable_devices(twin: nn.Module, root_class: str) -> None:
    """Raises TrainStepError when `twin`'s parameters are on a device type this process cannot reach.

    A fake on "cuda" has no storage, but autograd still runs the backward of each CUDA operation on
    that device: on a CUDA build without a GPU backward raises a CUDA context error, on a CPU-only
    build "Cannot access accelerator device" (before note [Fake CUDA on a build without CUDA], the
    missing device guard aborted the process there)."""
    unreachable = sorted({p.device.type for p in twin.parameters()} - {"cpu", "meta"} - _reachable_types())
    if unreachable:
        raise TrainStepError(
            f"{root_class}'s parameters are on {', '.join(unreachable)}, which this process cannot reach: autograd "
            "guards that device in each step, even on fakes. Defer the model on the CPU (the step's bytes are then "
            "counted without CUDA's 512-byte rounding) or run the step on a machine with that device"
        )


def _reachable_types() -> set[str]:
    """The accelerator types this process can use (a device type torch has no `is_available` for is
    let through: the step itself says what it cannot do)."""
    reachable = set()
    for name in ("cuda", "xpu", "mps", "mtia"):
        module = getattr(torch, name, None)
        available = getattr(module, "is_available", None)
        if name == "mps":
            available = torch.backends.mps.is_available
        if not callable(available) or available():
            reachable.add(name)
    return reachable


def _check_arguments(module: Any, world_size: int, shard: Any, loop: TrainingLoop) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.train_step expects an nn.Module, got {type(module).__name__}")
    if recording_graph() is not None:
        raise TrainStepError("train_step cannot run inside deferred_init: call it on the module deferred_init returned")
    if next(module.parameters(), None) is None:
        raise TrainStepError(
            f"{type(module).__name__} has no parameters: a training step would update nothing (the optimizer "
            "refuses an empty parameter list); for its forward alone use dry_run"
        )
    _refuse_sparse_gradients(module)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if shard is not None and world_size == 1:
        raise ValueError("shard= applies fully_shard under world_size > 1; with world_size=1 nothing is sharded")
    check_loop(loop)


def _refuse_sparse_gradients(module: nn.Module) -> None:
    """A sparse gradient (`nn.Embedding(sparse=True)`, `nn.EmbeddingBag(sparse=True)`) has no storage
    of its own, which PyTorch's MemTracker reads of every tensor (it fails on the eager loop too)."""
    for path, sub in module.named_modules():
        if getattr(sub, "sparse", False) is True and isinstance(sub, nn.Embedding | nn.EmbeddingBag):
            name = f"{type(module).__name__}.{path}" if path else type(module).__name__
            raise TrainStepError(
                f"{name} ({type(sub).__name__}) makes sparse gradients (sparse=True), which PyTorch's memory "
                "tracker cannot count (a sparse tensor has no storage of its own; the eager loop fails there "
                "too): estimate with sparse=False, whose gradient is dense, the size of the weight"
            )


def check_loop(loop: TrainingLoop) -> None:
    """Raises TypeError for a non-bool `keep_outputs`, ValueError for a bad `accumulation_steps`."""
    if not isinstance(loop.keep_outputs, bool):
        raise TypeError(f"keep_outputs must be True or False, got {loop.keep_outputs!r}")
    steps = loop.accumulation_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"accumulation_steps must be a positive int (micro-batches per optimizer step), got {steps!r}")


def train_step(
    module: nn.Module,
    *inputs_or_shapes: Any,
    optimizer: OptimizerFactory | None = None,
    loss: LossFunction | None = None,
    world_size: int = 1,
    shard: Callable[[nn.Module], Any] | None = None,
    activation_checkpointing: bool = False,
    keep_outputs: bool = True,
    accumulation_steps: int = 1,
    **forward_kwargs: Any,
) -> TrainStep:
    """Memory of one training step (forward, loss, backward, `optimizer.step()`) of `module`, on fakes.

    The step is the loop users write (note [The loop as users write it]): `keep_outputs` (default
    True) keeps the forward's output and the loss referenced until after `optimizer.step()` and
    `optimizer.zero_grad(set_to_none=True)`, as `out = model(...)` does; False drops them right after
    backward (`del out, loss`). `accumulation_steps=N`: N forwards and backwards on the same inputs
    (the loss divided by N), gradients accumulating, then one optimizer step.

    `module` may be deferred, partly materialized or eager; it is not changed, nothing is recorded,
    the global RNG is left as it was and no tensor storage is allocated. Inputs are read as in
    `dry_run` (shapes, tensors, a dict of keyword arguments; `forward_kwargs` are passed too).
    `optimizer`: a function from parameters to an optimizer (default `torch.optim.AdamW`);
    `loss`: a function of the output (default `default_loss`). `world_size > 1`: the step of rank 0
    under FSDP2 over a fake process group; `shard(twin)` applies `fully_shard` (default: each repeated
    block, then the root); process-group state is restored on any exit and DTensor's sharding caches
    are emptied, so no later real job of this process or of one forked from it is handed the fake
    rank's mesh (`fake_fsdp`, note [DTensor caches hold the fake rank]). `activation_checkpointing`:
    each repeated block is wrapped with `torch.utils.checkpoint` (before sharding).

    Raises TypeError for a non-module or a non-bool `keep_outputs`, ValueError for a bad world size or
    `accumulation_steps`, TrainStepError when the step
    cannot run on fake tensors (naming the phase and the innermost running module).
    """
    loop = TrainingLoop(keep_outputs, accumulation_steps)
    _check_arguments(module, world_size, shard, loop)
    make_optimizer = optimizer or torch.optim.AdamW
    rng_state = torch.get_rng_state()
    mode = CpuFakeTensorMode(allow_non_fake_inputs=True)
    try:
        twin, blocks = _prepare_twin(module, mode, activation_checkpointing)
        check_reachable_devices(twin, type(module).__name__)
        first = next(iter(twin.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        args, kwargs = fake_forward_arguments(module, mode, device, inputs_or_shapes, forward_kwargs)
        if world_size == 1:
            with mode, torch.enable_grad():
                tracker, run = _single(
                    twin,
                    args,
                    kwargs,
                    make_optimizer,
                    loss or default_loss,
                    type(module).__name__,
                    loop,
                )
        else:
            with (
                fake_process_group(world_size, device.type) as mesh,
                mode,
                torch.enable_grad(),
            ):
                tracker, run = _sharded(
                    twin,
                    mesh,
                    shard,
                    args,
                    kwargs,
                    make_optimizer,
                    loss or default_loss,
                    type(module).__name__,
                    loop,
                )
    finally:
        torch.set_rng_state(rng_state)
    return _result(module, twin, tracker, run, world_size, activation_checkpointing, str(device), blocks, loop)


def _result(
    module: nn.Module,
    twin: nn.Module,
    tracker: MemTracker,
    run: _StepRun,
    world_size: int,
    activation_checkpointing: bool,
    device: str,
    blocks: list[str],
    loop: TrainingLoop,
) -> TrainStep:
    """The TrainStep of a finished run: the peak and the end of forward by category, by module."""
    categories = SINGLE_CATEGORIES if world_size == 1 else FSDP_CATEGORIES
    return TrainStep(
        **step_measurements(module, twin, tracker, run, categories),
        world_size=world_size,
        activation_checkpointing=activation_checkpointing,
        device=device,
        blocks=blocks,
        keep_outputs=loop.keep_outputs,
        accumulation_steps=loop.accumulation_steps,
    )


def step_measurements(
    module: nn.Module, twin: nn.Module, tracker: MemTracker, run: _StepRun, categories: tuple[Category, ...]
) -> dict[str, Any]:
    """What a finished run measured, as `TrainStep` fields (every subclass shares them): the root's
    class, the optimizer, the peak and the end of forward by `categories`, the per-module tables,
    each phase's own peak and each repeated block's pass peaks."""
    peak_bytes, peak, peak_parts = breakdown(_peak_snapshot(tracker), categories)
    blocks = [path for path, _ in repeated_blocks(module)]
    end_of_forward_bytes, end_of_forward = _by_category(run.end_of_forward, categories)
    return {
        "root_class": type(module).__name__,
        "optimizer": run.optimizer_name,
        "peak_bytes": peak_bytes,
        "peak": peak,
        "phase": run.peak_phase,
        "phase_peaks": run.phase_peaks,
        "modules": module_table(module, twin, tracker),
        "end_of_forward_bytes": end_of_forward_bytes,
        "end_of_forward": end_of_forward,
        "end_of_forward_activations": forward_activation_table(module, twin, run.end_of_forward_owners),
        "phase_own_peaks": {phase: breakdown(snap, categories) for phase, snap in run.phase_own_peaks.items()},
        "block_peaks": {
            key: breakdown(snap, categories) for key, snap in block_peak_snapshots(twin, tracker, blocks).items()
        },
        "peak_by_module": nested(peak_parts, run.parts.labels() if run.parts is not None else ()),
    }


def _single(
    twin: nn.Module,
    args: tuple,
    kwargs: dict,
    make_optimizer: OptimizerFactory,
    loss: LossFunction,
    root_class: str,
    loop: TrainingLoop,
) -> tuple[MemTracker, _StepRun]:
    """The step on one device under `FastMemTracker`."""
    tracker = FastMemTracker()
    return tracker, run_step(twin, args, kwargs, make_optimizer, loss, tracker, root_class, loop)


def _sharded(
    twin: nn.Module,
    mesh: DeviceMesh,
    shard: Callable[[nn.Module], Any] | None,
    args: tuple,
    kwargs: dict,
    make_optimizer: OptimizerFactory,
    loss: LossFunction,
    root_class: str,
    loop: TrainingLoop,
) -> tuple[MemTracker, _StepRun]:
    """`twin` sharded over `mesh` (by `shard`, or each repeated block then the root), then the step
    of rank 0 under `FastFSDPMemTracker`. Raises TrainStepError when the root was left unsharded."""
    # Outside our fake mode: `fully_shard` without `mesh=` builds a DeviceMesh, which reads an index
    # tensor's values; the parameters are fakes of our mode, so what FSDP does to them stays fake.
    with lazy_fsdp_chunks(), unset_fake_temporarily():
        if shard is None:
            shard_blocks(twin, mesh)
        else:
            shard(twin)
    if not isinstance(twin, FSDPModule):
        raise TrainStepError(f"shard(...) left the root {root_class} unsharded: call fully_shard(module) on it last")
    tracker = FastFSDPMemTracker(twin, make_optimizer(twin.parameters()))
    return tracker, run_step(twin, args, kwargs, make_optimizer, loss, tracker, root_class, loop)
