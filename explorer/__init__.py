"""deferred-explorer engine: build modules without storage, inspect them, materialize with parity.

Data flow (one module per step): deferred (record) → graph → replay/materialize; inspection
(tables), render (diagrams), dryrun (fake forward), plan (devices) and fx_export only read the graph.
"""

from .deferred import deferred_init
from .errors import DeferredInitError, MaterializationError
from .fake import is_fake
from .materialize import is_deferred, materialize_module, materialize_tensor

# Read-only views of the recording; imported after the engine, which they read.
from .inspection import Inspection, inspect  # noqa: E402
from .render import module_graph, node_kind, op_graph  # noqa: E402
from .dryrun import DryRun, DryRunError, dry_run  # noqa: E402
from .plan import DevicePlanError, MemoryPlan, plan_devices  # noqa: E402
from .fx_export import InitProgram, to_fx  # noqa: E402

__all__ = [
    "DeferredInitError",
    "DevicePlanError",
    "DryRun",
    "DryRunError",
    "InitProgram",
    "Inspection",
    "MaterializationError",
    "MemoryPlan",
    "deferred_init",
    "dry_run",
    "inspect",
    "is_deferred",
    "is_fake",
    "materialize_module",
    "materialize_tensor",
    "module_graph",
    "node_kind",
    "op_graph",
    "plan_devices",
    "to_fx",
]
