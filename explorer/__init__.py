"""deferred-explorer engine: build modules without storage, inspect them, materialize with parity."""

from .deferred import deferred_init
from .errors import DeferredInitError, MaterializationError
from .fake import is_fake
from .materialize import is_deferred, materialize_module, materialize_tensor

__all__ = [
    "DeferredInitError",
    "MaterializationError",
    "deferred_init",
    "is_deferred",
    "is_fake",
    "materialize_module",
    "materialize_tensor",
]
