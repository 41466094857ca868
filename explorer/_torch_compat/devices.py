"""Fake CUDA tensors on a torch built without CUDA: the CUDA device guard that such a build lacks.

Note: [Fake CUDA on a build without CUDA]
Some of torch's Python bindings put a device guard around their call before any dispatch happens:
`Tensor.copy_`, `__getitem__` and `__setitem__` (so `weight[padding_idx].fill_(0)`), `contiguous`,
`.to("cuda", dtype)`, `.cuda()`, `new_tensor`, `nonzero`, `.item()`. The guard looks up the
tensor's device type in c10's table of guard implementations. A CUDA build has an entry for CUDA
even without a GPU, so a fake CUDA tensor passes. A CPU-only build (the CPU wheels, macOS) has
none, and the binding raises "PyTorch is not linked with support for cuda devices" before our
dispatch mode sees the op: recording `nn.Embedding(..., padding_idx=0, device="cuda")` or a
Hugging Face model under `torch.device("cuda")` failed there.

torchdistx's `fake_cuda` filled that entry with a no-op CUDA guard for the same reason, and so did
torch's own `torch._C._ensureCUDADeviceGuardSet()` (which FakeTensorMode calls) until its CPU-only
half was reverted (pytorch#163016): it now covers only a CUDA build without a device. No
`NoOpDeviceGuardImpl<CUDA>` exists in a CPU-only build, so `allow_fake_cuda` makes a near one: a
copy of the no-op guard CPU registers whose `exchangeDevice` and `getDevice` (the second and third
virtual functions) answer CUDA device 0, as one GPU would. CPU's own answers would be wrong, not
just odd: `.to("cuda")` takes a missing device index from `getDevice()` and would have made a CPU
tensor. The rest stays CPU's, `type()` included, on purpose: autograd's engine starts a worker
thread per device of every non-CPU guard type at its first backward, and a process with such
threads refuses backward in its forked children (the gloo tests fork ranks after fake steps);
a CUDA-typed guard with no device would instead be swapped for torch's `FakeGuardImpl`, eight
devices and the same threads, by the next FakeTensorMode. A guard on a fake has nothing to switch.
It is installed once per process, only where the CUDA entry is empty, and is checked before it is
kept: fakes on `cuda` must then index, copy and move to `"cuda"` onto `cuda:0`, or the entry is
emptied again. Real CUDA tensors stay impossible on such a build: making or moving one still
raises torch's "Torch not compiled with CUDA enabled".

The table is a C++ global reached through ctypes by its Itanium-ABI symbol in libc10 (Linux,
macOS), and the guard is a C++ object laid out by that ABI: one pointer to its virtual table,
whose slots follow the declaration order in `c10/core/impl/DeviceGuardImplInterface.h` (preceded
by offset-to-top and type info). Where the symbol cannot be found (Windows' MSVC mangling, a
static build) nothing changes and those bindings keep raising torch's error. Re-check the symbol,
the order of the first three declarations and the `DeviceType` numbering (CPU 0, CUDA 1,
`c10/core/DeviceType.h`) on upgrades; `tests/explorer/test_torch_compat.py` records such models on
every tested release.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

__all__ = ["allow_fake_cuda"]

_REGISTRY_SYMBOL = "_ZN3c104impl26device_guard_impl_registryE"  # c10::impl::device_guard_impl_registry
_CPU, _CUDA = 0, 1  # c10::DeviceType::CPU, c10::DeviceType::CUDA
_LIBRARIES = ("libc10.so", "libc10.dylib")
_VTABLE_HEAD = 2  # offset-to-top and type info, before the address point
_VTABLE_SLOTS = 48  # 26 virtual slots in torch 2.13 (24 functions, a destructor's two): room to grow
_CUDA_DEVICE_0 = _CUDA  # c10::Device{CUDA, 0}: two int8 fields, returned in one register

_EXCHANGE_DEVICE = ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_void_p, ctypes.c_uint16)
_GET_DEVICE = ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_void_p)

# What the made guard is made of; C++ holds raw pointers into these for the rest of the process.
_kept_alive: list[object] = []


@functools.cache
def allow_fake_cuda() -> bool:
    """Make the bindings that guard their tensor's device accept fake CUDA tensors (note [Fake
    CUDA on a build without CUDA]). True when they do: a CUDA build, or a CPU-only build whose
    empty CUDA guard entry now holds a no-op CUDA guard that passed its check. False where the
    entry is empty and stays so; then those bindings keep raising torch's own error."""
    registry = _guard_registry()
    if registry is None:
        return torch.backends.cuda.is_built()
    if registry[_CUDA] is not None:
        return True
    if registry[_CPU] is None:  # not the table this torch filled: leave it alone
        return False
    registry[_CUDA] = _no_op_cuda_guard(registry[_CPU])
    if _fake_cuda_behaves():
        return True
    registry[_CUDA] = None
    return False


def _no_op_cuda_guard(cpu_guard: int) -> int:
    """The address of a new guard object: CPU's no-op guard, but with CUDA device 0 as its device."""
    cpu_vtable = ctypes.c_void_p.from_address(cpu_guard).value
    assert cpu_vtable is not None
    word = ctypes.sizeof(ctypes.c_void_p)
    vtable = (ctypes.c_void_p * (_VTABLE_HEAD + _VTABLE_SLOTS)).from_buffer_copy(
        (ctypes.c_char * ((_VTABLE_HEAD + _VTABLE_SLOTS) * word)).from_address(cpu_vtable - _VTABLE_HEAD * word)
    )
    functions = {  # slot: function (slot 0, `type()`, stays CPU's: see the note)
        1: _EXCHANGE_DEVICE(lambda this, device: _CUDA_DEVICE_0),
        2: _GET_DEVICE(lambda this: _CUDA_DEVICE_0),
    }
    for slot, function in functions.items():
        vtable[_VTABLE_HEAD + slot] = ctypes.cast(function, ctypes.c_void_p).value
    guard = (ctypes.c_void_p * 1)(ctypes.addressof(vtable) + _VTABLE_HEAD * word)
    _kept_alive.extend([vtable, functions, guard])
    return ctypes.addressof(guard)


def _fake_cuda_behaves() -> bool:
    """Whether fakes on "cuda" now pass the guarded bindings and land on cuda:0 as with one GPU."""
    from .fake import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            made = torch.zeros(4, device="cuda")
            made[1:3].copy_(made[:2].contiguous())
            moved = [made.to("cuda"), made.cuda(), made.to("cuda", torch.float16), made.to(torch.float16)]
    except Exception:  # any refusal means the guard does not do its job: empty the entry again
        return False
    return made.device == torch.device("cuda:0") and all(t.device == made.device for t in moved)


def _guard_registry() -> ctypes.Array | None:
    """The first two slots (CPU, CUDA) of the guard table of the libc10 this torch loaded: the file
    beside torch's package, else (conda, system builds) the library already loaded under that name."""
    library_dir = Path(torch.__file__).parent / "lib"
    candidates = [str(library_dir / name) for name in _LIBRARIES if (library_dir / name).exists()]
    for candidate in [*candidates, "libc10.so"]:
        try:
            library = ctypes.CDLL(candidate)
            return (ctypes.c_void_p * 2).in_dll(library, _REGISTRY_SYMBOL)
        except (OSError, ValueError):
            continue
    return None
