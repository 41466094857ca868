"""Exception families of the engine: one class per way things go wrong.

Messages name the culprit (op, module path, tensor name, source line) because the user usually
sees them far from where the problem started: in a notebook cell that materializes a module
built minutes earlier.
"""

from __future__ import annotations


class DeferredInitError(RuntimeError):
    """Building a module under `deferred_init` failed.

    `graph` holds what was recorded up to the failing op, so the partial construction can still be
    inspected.
    """

    def __init__(self, message: str, graph: object | None = None) -> None:
        super().__init__(message)
        self.graph = graph


class MaterializationError(RuntimeError):
    """Replaying recorded ops into real tensors failed; the module was left unchanged."""
