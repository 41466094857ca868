"""Let `import torchvision` (and so `import timm`, and transformers' image code) work beside CPU torch.

The PyPI `torchvision` wheel is a CUDA build: its C++ extension (`torchvision/_C.so`) links
`libc10_cuda.so`, which the CPU torch wheel does not ship, so the extension does not load.
torchvision tolerates that for most ops, but its `_meta_registrations.py` calls
`torch.library.register_fake("torchvision::nms")` (and `qnms`) unconditionally, which raises
"operator torchvision::nms does not exist" and aborts the import. timm needs only torchvision's
pure-Python parts (`ops.misc.FrozenBatchNorm2d`, transforms), so declaring those two schemas is
enough: the import succeeds and calling a torchvision C op still fails with torch's own
"no kernel" error. Where the real extension loads (a matching CPU or CUDA pair), it is loaded and
nothing is declared.

`make install` copies this file into the venv's site-packages as
`deferred_explorer_torchvision_hook.py` with a `.pth` file that calls `install()` at interpreter
start: a finder on `sys.meta_path` that, on the first `import torchvision` of any process (pytest,
notebook kernels, benchmarks, `make lab`), declares the schemas and steps aside. Nothing is
imported before that, so processes that never touch torchvision pay nothing. Outside the venv made
by the Makefile nothing of this is installed.

Note: mirrors torchvision 0.28 `_meta_registrations.py`; re-check the list of ops registered with
`register_fake` when torchvision is upgraded.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

# Ops whose fake kernels torchvision registers without checking that its extension loaded.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library.Library holding the declared schemas


def _extension_path() -> Path | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidates = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"))
    return candidates[0] if candidates else None


def _declared(torch) -> bool:  # noqa: ANN001 - the torch module, imported late
    try:
        torch.ops.torchvision.nms.default
        return True
    except (AttributeError, RuntimeError):
        return False


def declare_torchvision_ops() -> bool:
    """Make torchvision importable; True when its op schemas are declared (here or by an earlier
    call), False when the real extension loads or torchvision is not installed.

    Idempotent. Call before the first `import torchvision` / `import timm` of the process.
    """
    import torch

    global _library
    extension = _extension_path()  # finding torchvision may itself run the venv's hook, which declares
    if _library is not None or _declared(torch):
        return True
    if extension is None:
        return False  # torchvision not installed: nothing to do
    try:
        torch.ops.load_library(str(extension))
        return False  # the real extension loads: its own schemas are there
    except OSError:
        pass
    _library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        _library.define(schema)
    return True


class _DeclareBeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs `declare_torchvision_ops` when `torchvision` is first imported, then leaves `sys.meta_path`."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - importlib's protocol
        if name == "torchvision":
            sys.meta_path.remove(self)
            declare_torchvision_ops()
        return None  # the regular finders import torchvision itself


def install() -> None:
    """Arm the finder (idempotent); a no-op once torchvision is imported."""
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(finder, _DeclareBeforeTorchvision) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DeclareBeforeTorchvision())
