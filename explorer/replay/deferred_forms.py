"""What each materialized tensor goes back to when it is released: the deferred tensor it replaced.

`materialize_*` note, for every real tensor it hands out, the fake it was made from, in a weak table
keyed by the real tensor's identity (as `provenance.py` does, so nothing is attached to the tensor).
The entry holds the fake strongly: releasing puts back that very object (identity, ties and
`nn.Parameter` kind stay what the explorer showed), and its graph is the recipe that materializes it
again. So a materialized tensor keeps its recorded graph alive for as long as it lives; dropping it
(or the module) frees both. A tensor restored from a checkpoint will be released the same way: its
fake's graph then holds the op that reads it back.

The version counter and storage noted beside the fake tell whether the real tensor was changed
since (an optimizer step, `.data = x`, `module.to(...)`): releasing it would lose that change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..record.fake import version_of
from ..record.weak_holders import register_weak_holder


@dataclass(frozen=True, slots=True)
class DeferredForm:
    """The fake a real tensor was materialized from, and how the real tensor stood then."""

    fake: torch.Tensor  # a DeferredTensor (record/fake.py); holds its graph
    version: int | None  # the real tensor's `_version` then; None for inference tensors (no counter)
    storage: int  # `untyped_storage()._cdata` then: an id, never the storage (that would pin its memory)

    def changed_since(self, real: torch.Tensor) -> str | None:
        """How `real` was changed since it was materialized, in words, or None if it was not."""
        if real.untyped_storage()._cdata != self.storage:
            return "its memory was replaced (`.data = ...`, or `module.to(...)`/`.half()` on parameters)"
        version = version_of(real)
        if version != self.version:
            return (
                f"it was modified in place (version counter {self.version} → {version}: "
                "an optimizer step, `copy_`, `mul_`...)"
            )
        return None


_forms: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _let_go(real: torch.Tensor) -> Callable[[], None] | None:
    """Note [Materialized tensors swap too] in record/weak_holders.py."""
    form = _forms.pop(real, None)
    return None if form is None else lambda: _forms.__setitem__(real, form)


register_weak_holder(_let_go)


def remember_deferred_forms(fakes: Sequence[torch.Tensor], reals: Sequence[torch.Tensor]) -> None:
    """Note that each of `reals` was materialized from the fake at the same position. A real tensor
    handed out again (memoized) keeps its first entry: its version then is the one to compare with."""
    for fake, real in zip(fakes, reals):
        if real not in _forms:
            _forms[real] = DeferredForm(fake, version_of(real), real.untyped_storage()._cdata)


def deferred_form_of(real: torch.Tensor) -> DeferredForm | None:
    """The form `real` goes back to on release, or None (an eager or user-made tensor, or a fake)."""
    return _forms.get(real)


def forget_deferred_form(real: torch.Tensor) -> None:
    """Drop `real`'s entry (it was released: the fake is back in its slots)."""
    _forms.pop(real, None)
