"""Library methods that rebuild parts of a model, run inside the model's own recording.

Hugging Face's `model.resize_token_embeddings(n)` builds a new `nn.Embedding` eagerly, draws its
init from the real generator, copies the old rows into it and swaps its storage into the old
parameter. On a deferred model, outside any recording, the new embedding would be real and its
random rows drawn where the real generator is, not where eager's would be. Called inside
`explorer.deferred(model)` it is all recorded into the model's recording, and materializing gives
eager's bytes. So the methods listed here do exactly that when called on a deferred model outside
a recording; on an eager model, or inside one, they run as they are.

Note: [Surgery methods are wrapped on their class] each listed method is replaced on its class (for
every instance: there is no per-instance hook that survives `copy.deepcopy`) once a deferred
recording has finished and the library is imported; the wrapper checks its `self` first and calls
the original. Re-check the list on library upgrades (tests/explorer/record/test_equal_or_refused.py).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from torch import nn

from .fake import handle_of
from .scope import recording_graph

# (module, class, methods): methods that replace or grow parts of the model they are called on.
SURGERY_METHODS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("transformers.modeling_utils", "PreTrainedModel", ("resize_token_embeddings",)),
)

ExtendRecording = Callable[[nn.Module], AbstractContextManager[Any]]


def holds_deferred_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of `module` is still a deferred fake."""
    return any(handle_of(tensor) is not None for tensor in [*module.parameters(), *module.buffers()])


def install_surgery_hooks(extend: ExtendRecording) -> None:
    """Wrap the listed methods of the libraries imported by now (once each; see the note)."""
    for module_name, class_name, methods in SURGERY_METHODS:
        library = sys.modules.get(module_name)
        owner = getattr(library, class_name, None) if library is not None else None
        if owner is None:
            continue
        for name in methods:
            original = owner.__dict__.get(name)
            if original is None or getattr(original, "_explorer_surgery", False):
                continue
            setattr(owner, name, _in_own_recording(original, extend))


def _in_own_recording(original: Callable[..., Any], extend: ExtendRecording) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        outside = recording_graph() is None and holds_deferred_tensors(self)
        with extend(self) if outside else contextlib.nullcontext():
            return original(self, *args, **kwargs)

    method._explorer_surgery = True  # type: ignore[attr-defined]  # a marker on the wrapper function
    return method
