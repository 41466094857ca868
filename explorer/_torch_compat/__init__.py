"""The one place that knows which PyTorch is running.

Every private PyTorch API the engine, the analyses and the widgets touch is reached through this
package: FakeTensor's layout (`fake`), dispatch guards and storage identity (`dispatch`),
the CPU generator's state layout (`generators`), FLOP formulas that count attention alike on every
release (`flops`), DTensor's rows rule (`dtensor`), PyTorch's memory trackers made fast
(`memory_tracker`) and the distributed internals of the training analyses (`distributed`,
`pipelining`, imported only where a training step needs them). Each entry tests for
the feature it needs rather than for a version string, so a release that keeps the feature keeps
working and one that drops it fails here, at one named place, instead of deep in a recording.
`docs/internals.md` ("Torch releases") lists each entry with the releases it was checked on;
`tests/explorer/test_torch_compat.py` pins the behaviour every release must give.

Nothing outside this package imports a private torch module (`torch._subclasses`, `torch._C`,
`torch.distributed._tools`, `torch.distributed.tensor._*`...), names `torch._x`, or reads a torch
object's private attribute through `__dict__` (`tests/test_layout.py`, note [The compat boundary]).
"""

from __future__ import annotations

import re
import warnings

import torch

# The releases the suites run on (`make test` on 2.13, `make test-torch` on the others; CI runs the
# oldest and the newest). pyproject.toml admits the same range.
OLDEST_TESTED = (2, 11)
NEWEST_TESTED = (2, 15)
TESTED_RANGE = "torch>=2.11,<2.16"


class UntestedTorchWarning(UserWarning):
    """The running torch is outside the releases the project is tested on: it may still work."""


def torch_release(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of `version` (default: the running torch), local and pre-release tags
    ignored: '2.11.0+cu130' → (2, 11), '2.16.0.dev20261120' → (2, 16)."""
    text = torch.__version__ if version is None else version
    match = re.match(r"(\d+)\.(\d+)", str(text))
    if match is None:
        raise ValueError(f"cannot read a torch release from {text!r}")
    return int(match.group(1)), int(match.group(2))


def is_tested_release(version: str | None = None) -> bool:
    """True when `version` (default: the running torch) lies in the tested range."""
    return OLDEST_TESTED <= torch_release(version) <= NEWEST_TESTED


def warn_if_untested(version: str | None = None) -> bool:
    """Warn (UntestedTorchWarning, naming the tested range) when torch is outside it; True if so.
    Never refuses: a newer torch usually works, and every feature entry here fails clearly if not."""
    if is_tested_release(version):
        return False
    shown = torch.__version__ if version is None else version
    warnings.warn(
        f"deferred-explorer is tested with {TESTED_RANGE} (2.11 to 2.15); this is torch {shown}. "
        "It may work; if something fails, the error names the torch feature it needed.",
        UntestedTorchWarning,
        stacklevel=3,
    )
    return True
