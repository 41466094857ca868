"""PyTorch's own `module_db`: deferred_init + materialize_module equals eager construction.

`torch.testing._internal.common_modules.module_db` lists the modules of `torch.nn` with sample
constructor and forward inputs (`ModuleInput`). Every entry whose module holds a parameter or
buffer for some input is covered (45 on torch 2.13), in float32 (up to 8 distinct constructor
inputs each) and float64 (up to 4, built with `dtype=torch.float64` where the constructor takes it):

* full materialization gives, for every parameter and buffer (duplicates included), the eager
  value bit for bit (compared as bytes, so NaN payloads and signed zeros count), with the same
  dtype, device, shape, stride, storage offset, requires_grad and Python type, the same tie groups
  (one object wherever eager shares one) and storage groups; tensors the caller passed (a loss's
  class weights) stay the caller's objects; deferred_init and materialization leave the global RNG
  untouched;
* for entries with submodules, materializing one submodule at a time, in reverse module order,
  ends in the same state;
* a forward pass in eval mode on the entry's own forward input gives outputs identical to eager.

No entry is expected to fail. Lazy modules (`nn.LazyConv*`) are built as deferred_init documents
for them, by calling the module once on its forward input inside module_fn; built bare they
cannot be materialized, and `test_lazy_entry_without_a_call_names_its_uninitialized_parameter`
pins that error.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from explorer import MaterializationError, deferred_init, is_deferred, is_fake, materialize_module
from tests.support.parity import assert_same_kind_and_layout, same_bits, slots, storage_groups, tie_groups

pytest.importorskip("expecttest")  # common_modules imports it

_flags_were_frozen = torch.backends.flags_frozen()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_modules import ModuleInfo, module_db
if not _flags_were_frozen:  # common_utils' import froze torch.backends flags for the whole session: undo
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True

SEED = 0
DTYPES = (torch.float32, torch.float64)


# Distinct constructor inputs kept per entry (LinearCrossEntropyLoss alone has 437), spread evenly.
MAX_CONSTRUCTORS = {torch.float32: 8, torch.float64: 4}


@dataclasses.dataclass(frozen=True)
class Case:
    """One distinct constructor input of one module_db entry, with the forward input that goes with it."""

    info: ModuleInfo
    dtype: torch.dtype
    index: int  # position of the first ModuleInput with this constructor input
    args: tuple
    kwargs: dict
    forward_args: tuple
    forward_kwargs: dict
    has_children: bool = False

    @property
    def id(self) -> str:
        return f"{self.info.name}-{str(self.dtype).removeprefix('torch.')}-{self.index}"

    @property
    def lazy(self) -> bool:
        return issubclass(self.info.module_cls, LazyModuleMixin)

    def construct(self, builder: Callable[..., nn.Module] | None = None) -> nn.Module:
        """The module, built directly or by `builder(module_fn, *args, **kwargs)` (deferred_init). A lazy module
        is called once on its forward input (as documented for deferred_init: its parameters get
        their shape, and their values, on the first call)."""
        module_fn = _built_and_called_once(self) if self.lazy else self.info.module_cls
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TransformerEncoder's nested-tensor notice
            if builder is None:
                return module_fn(*self.args, **self.kwargs)
            return builder(module_fn, *self.args, **self.kwargs)


def _built_and_called_once(case: Case) -> Callable[..., nn.Module]:
    def module_fn(*args: Any, **kwargs: Any) -> nn.Module:
        module = case.info.module_cls(*args, **kwargs)
        with torch.no_grad():
            module(*case.forward_args, **case.forward_kwargs)
        return module

    return module_fn


def _structure(value: object) -> object:
    """What a constructor input is, up to tensor values (which make_tensor draws at random)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_structure(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _structure(v)) for k, v in value.items()))
    return repr(value)


def _shape_only(info: ModuleInfo, args: tuple, kwargs: dict) -> nn.Module:
    """The module built on the meta device: enough to see which tensors it holds, and cheap."""
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return info.module_cls(*args, **kwargs)


def _entry_cases(info: ModuleInfo, dtype: torch.dtype) -> list[Case]:
    """The entry's distinct constructor inputs whose module holds tensors, at most MAX_CONSTRUCTORS[dtype]
    (spread evenly over the list). module_db builds in float32 and calls `.to(dtype)`; here the
    module is built in `dtype` directly (factory kwarg `dtype=`) where its constructor takes one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False, training=False)
    cases, seen = [], set()
    for index, module_input in enumerate(inputs):
        ctor, fwd = module_input.constructor_input, module_input.forward_input
        key = _structure((ctor.args, ctor.kwargs))
        if key in seen:
            continue
        seen.add(key)
        kwargs = dict(ctor.kwargs)
        if dtype != torch.get_default_dtype() and "dtype" not in kwargs:
            try:
                module = _shape_only(info, ctor.args, {**kwargs, "dtype": dtype})
                kwargs["dtype"] = dtype
            except TypeError:  # no factory kwargs: its tensors come from the (dtype) inputs
                module = _shape_only(info, ctor.args, kwargs)
        else:
            module = _shape_only(info, ctor.args, kwargs)
        if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
            cases.append(Case(
                info, dtype, index, tuple(ctor.args), kwargs, tuple(fwd.args), dict(fwd.kwargs),
                has_children=any(True for _ in module.children()),
            ))
    limit = MAX_CONSTRUCTORS[dtype]
    if len(cases) > limit:
        cases = [cases[i * len(cases) // limit] for i in range(limit)]
    return cases


def _cases() -> list[Case]:
    rng = torch.get_rng_state()
    torch.manual_seed(SEED)  # module_inputs_func draws its tensors from the global RNG
    cases: list[Case] = []
    try:
        for info in module_db:
            for dtype in DTYPES:
                entry = _entry_cases(info, dtype) if dtype in info.dtypes else []
                cases += entry
                if not entry:  # a module that holds no tensor in float32 holds none in float64
                    break
        return cases
    finally:
        torch.set_rng_state(rng)


CASES = _cases()


def build_eager(case: Case) -> nn.Module:
    torch.manual_seed(SEED)
    return case.construct()


def build_deferred(case: Case) -> nn.Module:
    torch.manual_seed(SEED)
    before = torch.get_rng_state()
    module = case.construct(deferred_init)
    assert torch.equal(torch.get_rng_state(), before), f"{case.id}: deferred_init advanced the global RNG"
    return module


def caller_tensors(case: Case) -> dict[int, str]:
    """Tensors the caller passed to the constructor (a loss's class weights): modules keep them as
    they are, eager and deferred alike."""
    named = [(f"args[{i}]", v) for i, v in enumerate(case.args)] + [(f"{k}=", v) for k, v in case.kwargs.items()]
    return {id(v): name for name, v in named if isinstance(v, torch.Tensor)}


def assert_equal_to_eager(module: nn.Module, eager: nn.Module, case: Case) -> None:
    assert type(module) is type(eager)
    submodules = [(n, type(m)) for n, m in module.named_modules()]
    assert submodules == [(n, type(m)) for n, m in eager.named_modules()], f"{case.id}: submodules differ"
    assert list(module.state_dict()) == list(eager.state_dict()), f"{case.id}: state_dict keys differ"
    expected, actual = slots(eager), slots(module)
    assert [n for n, _ in actual] == [n for n, _ in expected], f"{case.id}: parameter/buffer names differ"
    given = caller_tensors(case)
    for (name, want), (_, got) in zip(expected, actual):
        where = f"{case.id}: {name}"
        assert given.get(id(got)) == given.get(id(want)), f"{where}: not the caller's tensor object as in eager"
        assert_same_kind_and_layout(where, got, want)
        assert got.storage_offset() == want.storage_offset(), f"{where}: storage offset"
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad {got.requires_grad}"
        assert same_bits(got, want), f"{where}: values differ"
    assert tie_groups(actual) == tie_groups(expected), f"{case.id}: tie groups differ"
    assert storage_groups(actual) == storage_groups(expected), f"{case.id}: storage groups differ"
    assert not is_deferred(module)


def tensor_leaves(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensor_leaves(item)]
    if value is None:
        return []
    raise TypeError(f"unexpected forward output {type(value).__name__}")


def forward(module: nn.Module, case: Case) -> list[torch.Tensor]:
    if any(t.is_floating_point() and t.dtype != case.dtype for t in module.buffers()):
        module.to(case.dtype)  # as module_db's own tests do: FractionalMaxPool's samples are float64
    module.eval()
    torch.manual_seed(SEED + 1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tensor_leaves(module(*case.forward_args, **case.forward_kwargs))


@functools.lru_cache(maxsize=None)
def eager_reference(case_id: str) -> tuple[nn.Module, list[torch.Tensor]]:
    """The eager module (never modified) and its forward outputs (from a copy of it)."""
    case = CASE_BY_ID[case_id]
    eager = build_eager(case)
    return eager, forward(copy.deepcopy(eager), case)


def assert_same_forward(module: nn.Module, case: Case) -> None:
    want, got = eager_reference(case.id)[1], forward(module, case)
    assert len(got) == len(want), f"{case.id}: forward gave {len(got)} tensors, eager {len(want)}"
    for index, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"{case.id}: forward output {index}")


def build_deferred_checked(case: Case) -> nn.Module:
    module = build_deferred(case)
    given = caller_tensors(case)
    expected = any(id(t) not in given for _, t in slots(eager_reference(case.id)[0]))
    assert is_deferred(module) == expected, f"{case.id}: is_deferred(module) is {not expected}"
    return module


CASE_BY_ID = {case.id: case for case in CASES}
ALL = pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
WITH_CHILDREN = [case for case in CASES if case.dtype == torch.float32 and case.has_children]


@pytest.mark.slow
@ALL
def test_full_materialization_equals_eager(case):
    module = build_deferred_checked(case)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    assert materialize_module(module) is module
    assert torch.equal(torch.get_rng_state(), before), f"{case.id}: materialize_module advanced the global RNG"
    assert_equal_to_eager(module, eager_reference(case.id)[0], case)
    assert_same_forward(module, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", WITH_CHILDREN, ids=[case.id for case in WITH_CHILDREN])
def test_reverse_submodule_by_submodule_equals_eager(case):
    module = build_deferred_checked(case)
    torch.manual_seed(4321)
    before = torch.get_rng_state()
    for name, sub in reversed(list(module.named_modules())):
        materialize_module(sub, check_fn=lambda m, sub=sub: m is sub)
        own = [t for t in [*sub._parameters.values(), *sub._buffers.values()] if t is not None]
        assert not any(is_fake(t) for t in own), f"{case.id}: {name or 'root'} still holds fakes"
    assert torch.equal(torch.get_rng_state(), before), f"{case.id}: materialize_module advanced the global RNG"
    assert_equal_to_eager(module, eager_reference(case.id)[0], case)
    assert_same_forward(module, case)


LAZY = [case for case in CASES if case.lazy and case.dtype == torch.float32]


@pytest.mark.parametrize("case", LAZY, ids=[case.id for case in LAZY])
def test_lazy_entry_without_a_call_names_its_uninitialized_parameter(case):
    """The documented limit: a lazy module's shapes come from its first call, so one built without
    that call (module_db's bare constructor input) cannot be materialized, and says why."""
    module = deferred_init(case.info.module_cls, *case.args, **case.kwargs)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    assert str(error.value) == (
        "'weight' is an uninitialized lazy parameter: call the module once on an example input "
        "inside module_fn so its shape is known"
    )


# The entries of torch 2.13's module_db whose modules hold a parameter or buffer for some input.
ENTRIES_WITH_TENSORS = {
    "nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d", "nn.Conv1d", "nn.Conv2d", "nn.Conv3d",
    "nn.ConvTranspose1d", "nn.ConvTranspose2d", "nn.ConvTranspose3d", "nn.FractionalMaxPool2d",
    "nn.FractionalMaxPool3d", "nn.LazyConv1d", "nn.LazyConv2d", "nn.LazyConv3d", "nn.LazyConvTranspose1d",
    "nn.LazyConvTranspose2d", "nn.LazyConvTranspose3d", "nn.Linear", "nn.Bilinear", "nn.MultiMarginLoss",
    "nn.MultiLabelSoftMarginLoss", "nn.NLLLoss", "nn.BCELoss", "nn.BCEWithLogitsLoss", "nn.CrossEntropyLoss",
    "nn.LinearCrossEntropyLoss", "nn.GroupNorm", "nn.InstanceNorm1d", "nn.InstanceNorm2d", "nn.InstanceNorm3d",
    "nn.LayerNorm", "nn.RMSNorm", "nn.TransformerEncoder", "nn.TransformerEncoderLayer",
    "nn.TransformerDecoderLayer", "nn.Transformer", "nn.MultiheadAttention", "nn.Embedding", "nn.PReLU",
    "nn.RNNCell", "nn.GRUCell", "nn.LSTMCell", "nn.RNN", "nn.GRU", "nn.LSTM",
}


def test_every_module_db_entry_with_tensors_is_covered_in_both_dtypes():
    """No entry drops out silently (say, because its inputs changed shape): each one known to hold
    tensors, and present in this torch's module_db, has float32 and float64 cases."""
    present = {info.name for info in module_db}
    for dtype in DTYPES:
        covered = {case.info.name for case in CASES if case.dtype == dtype}
        assert covered >= ENTRIES_WITH_TENSORS & present, sorted((ENTRIES_WITH_TENSORS & present) - covered)
