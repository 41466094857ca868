"""deferred-explorer engine: build modules without storage, inspect them, materialize with parity.

The folders read as the data flow: `record/` (deferred_init, the recording mode, fake tensors) →
`graph.py` (the recorded program every stage shares) → `replay/` (closures, RNG parity, devices,
materialize); `inspection/` (tables), `render/` (diagrams) and `analysis/` (dry run, memory plan,
FX export) only read the graph; `distributed.py` hands materialization to FSDP2/DTensor.
"""

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
# Read-only views of the recording and analyses over it; imported after the engine, which they read.
from .analysis.checkpoint_check import CheckpointCheck, check_checkpoint
from .analysis.dry_run import DryRun, DryRunError, dry_run
from .analysis.forward_graph import ForwardGraph, ForwardGraphError, forward_graph
from .analysis.fx_export import InitProgram, to_fx
from .analysis.init_report import init_report
from .analysis.memory_plan import DevicePlanError, MemoryPlan, plan_devices
from .analysis.train_step import TrainStep, TrainStepError, train_step
from .inspection import Inspection, inspect
from .render import module_graph, node_kind, op_graph

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
    "load_checkpoint",
    "materialize_module",
    "materialize_tensor",
    "slice_plan",
    "SlicePlan",
    "WholeBaseWarning",
    "module_graph",
    "node_kind",
    "op_graph",
    "plan_devices",
    "release_module",
    "save_checkpoint",
    "to_fx",
    "TrainStep",
    "TrainStepError",
    "train_step",
]
