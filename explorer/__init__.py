"""deferred-explorer engine: build modules without storage, inspect them, materialize with parity.

The folders read as the data flow: `record/` (deferred_init, the recording mode, fake tensors) →
`graph.py` (the recorded program every stage shares) → `replay/` (closures, RNG parity, devices,
materialize); `inspection/` (tables), `render/` (diagrams) and `analysis/` (dry run, memory plan,
FX export) only read the graph; `distributed.py` hands materialization to FSDP2/DTensor.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._torch_compat import warn_if_untested as _warn_if_untested
from ._version import __version__
from .errors import CheckpointError, DeferredInitError, MaterializationError, NoDataError, ReleaseError
from .record.checkpoint_load import load_checkpoint
from .record.deferred import DeferredBlock, deferred, deferred_init, deferred_roots
from .record.fake import is_fake
from .replay.materialize import is_deferred, materialize_module, materialize_tensor
from .replay.release import release_module
from .replay.save import save_checkpoint
from .replay.slices import SlicePlan, WholeBaseWarning, slice_plan

# isort: split
# Read-only views of the recording and analyses over it. They load pandas, torch.distributed and the
# memory tracker (about a second beyond torch), so each loads when first asked for, not with the
# engine: `import explorer` costs little more than `import torch` (benchmarks/import_bench.py).
_LAZY: dict[str, str] = {
    "CheckpointCheck": ".analysis.checkpoint_check",
    "check_checkpoint": ".analysis.checkpoint_check",
    "DryRun": ".analysis.dry_run",
    "DryRunError": ".analysis.dry_run",
    "dry_run": ".analysis.dry_run",
    "ForwardGraph": ".analysis.forward_graph",
    "ForwardGraphError": ".analysis.forward_graph",
    "forward_graph": ".analysis.forward_graph",
    "InitProgram": ".analysis.fx_export",
    "to_fx": ".analysis.fx_export",
    "init_report": ".analysis.init_report",
    "Layout": ".analysis.parallel_layout",
    "LayoutError": ".analysis.parallel_layout",
    "ParallelPlan": ".analysis.parallel_plan",
    "plan_parallel": ".analysis.parallel_plan",
    "to_python": ".analysis.layout_export",
    "to_torchtitan": ".analysis.layout_export",
    "DevicePlanError": ".analysis.memory_plan",
    "MemoryPlan": ".analysis.memory_plan",
    "plan_devices": ".analysis.memory_plan",
    "TrainStep": ".analysis.train_step",
    "TrainStepError": ".analysis.train_step",
    "train_step": ".analysis.train_step",
    "Inspection": ".inspection",
    "inspect": ".inspection",
    "module_graph": ".render",
    "node_kind": ".render",
    "op_graph": ".render",
}

if TYPE_CHECKING:
    from .analysis.checkpoint_check import CheckpointCheck, check_checkpoint
    from .analysis.dry_run import DryRun, DryRunError, dry_run
    from .analysis.forward_graph import ForwardGraph, ForwardGraphError, forward_graph
    from .analysis.fx_export import InitProgram, to_fx
    from .analysis.init_report import init_report
    from .analysis.layout_export import to_python, to_torchtitan
    from .analysis.memory_plan import DevicePlanError, MemoryPlan, plan_devices
    from .analysis.parallel_layout import Layout, LayoutError
    from .analysis.parallel_plan import ParallelPlan, plan_parallel
    from .analysis.train_step import TrainStep, TrainStepError, train_step
    from .inspection import Inspection, inspect
    from .render import module_graph, node_kind, op_graph


def __getattr__(name: str) -> Any:
    """Load an analysis on first use (PEP 562); the name is then an ordinary module attribute."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'explorer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_warn_if_untested()  # a torch outside the tested releases gets a warning naming them, never a refusal

__all__ = [
    "__version__",
    "CheckpointCheck",
    "CheckpointError",
    "DeferredBlock",
    "DeferredInitError",
    "DevicePlanError",
    "DryRun",
    "DryRunError",
    "InitProgram",
    "Inspection",
    "MaterializationError",
    "MemoryPlan",
    "NoDataError",
    "ReleaseError",
    "check_checkpoint",
    "deferred",
    "deferred_init",
    "deferred_roots",
    "dry_run",
    "forward_graph",
    "ForwardGraph",
    "ForwardGraphError",
    "init_report",
    "inspect",
    "is_deferred",
    "is_fake",
    "Layout",
    "LayoutError",
    "load_checkpoint",
    "materialize_module",
    "materialize_tensor",
    "slice_plan",
    "SlicePlan",
    "WholeBaseWarning",
    "module_graph",
    "node_kind",
    "op_graph",
    "ParallelPlan",
    "plan_devices",
    "plan_parallel",
    "release_module",
    "save_checkpoint",
    "to_fx",
    "to_python",
    "to_torchtitan",
    "TrainStep",
    "TrainStepError",
    "train_step",
]
