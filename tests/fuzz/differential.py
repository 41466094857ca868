"""Eager vs deferred+materialized, for one program: the three ways of materializing it.

* full: `materialize_module(root)` in one call;
* plan: a `Plan` of single tensors and (sub)modules in a random order, then the rest;
* single: one slot alone from a fresh deferred module (nothing else materialized);
* rows: rows [1, n) of every slot of a fresh deferred module, drawn alone (`draw_rows`, what an FSDP2
  rank draws) and as a view made by `materialize_tensor(t[1:])` (the slice path), against eager's.

Each must agree with eager construction bit for bit on the facts of `compare.snapshot`, or stop
with a refusal that tests/fuzz/refusals.py promises (`check_outcome`). Materialization must leave the
global RNG where it found it, and so must deferred_init and the steps after it unless they draw,
seed or build modules for real. With rng="fast" the values
differ from eager by design; everything else must not, and the plan must equal the single call.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
from torch import nn

from explorer import DeferredInitError, MaterializationError, deferred_init, is_deferred, materialize_module
from explorer import is_fake, materialize_tensor, slice_plan
from explorer.replay.rows import draw_rows
from explorer.replay.slices import WholeBaseWarning
from tests.fuzz.after import AfterWorld, run_after
from tests.fuzz.compare import Snapshot, differences, slots, snapshot
from tests.fuzz.interpreter import FuzzModule, make_externals
from tests.fuzz.program import AFTER_RNG_OPS, Plan, Program
from tests.fuzz.refusals import Phase, Verdict, judge

# Set between deferred_init and materialization: replay must not depend on the RNG state then.
_UNRELATED_SEED = 987654321
# After steps that move the global generator for real (draws, seeds, new eager modules): with them,
# the global RNG after the deferred run is not the one before it.
_MOVES_RNG = (*AFTER_RNG_OPS, "new_linear", "new_from", "second_model")
_SETS_RNG = ("reseed", "restore_rng")  # constructor steps that set the generator, as eager's do


class Mismatch(AssertionError):
    """Eager and deferred construction disagree; the message lists every difference."""


class Refused(Exception):
    """The deferred run raised one of explorer's errors: where, and how it is judged."""

    def __init__(self, error: BaseException, phase: Phase, program: Program) -> None:
        self.error, self.phase, self.verdict = error, phase, judge(error, phase)
        super().__init__(f"{type(error).__name__} at {phase}: {error}\n{program!r}")

    @property
    def promised(self) -> bool:
        return self.verdict.refusal is not None and not self.verdict.problem


def build_eager(program: Program) -> tuple[nn.Module, list[torch.Tensor]]:
    """The eager module (or, when the steps after construction made modules, a root holding them)."""
    externals = make_externals(program)
    torch.manual_seed(program.seed)
    world = AfterWorld(program, False, {"model": FuzzModule(program, externals)})
    run_after(world, program.after)
    return world.holder(), externals + world.externals


def build_deferred(program: Program) -> tuple[nn.Module, list[torch.Tensor]]:
    """`build_eager` under deferred_init; raises Refused naming the phase where explorer refused."""
    externals = make_externals(program)
    torch.manual_seed(program.seed)
    before = torch.get_rng_state()
    phase: list[Phase] = ["construction"]
    try:
        world = AfterWorld(program, True, {"model": deferred_init(FuzzModule, program, externals)})
        run_after(world, program.after, lambda i: phase.__setitem__(0, program.after[i][0]))  # recorded
    except (DeferredInitError, MaterializationError) as error:
        raise Refused(error, phase[0], program) from error
    moved = not torch.equal(torch.get_rng_state(), before)
    if moved and not any(step[0] in _MOVES_RNG for step in program.after) and not any(
        step[0] in _SETS_RNG for step in program.steps
    ):
        raise Mismatch(f"deferred_init (or the steps after it) moved the global RNG\n{program!r}")
    torch.manual_seed(_UNRELATED_SEED)
    return world.holder(), externals + world.externals


def _owner(root: nn.Module, name: str) -> tuple[dict, str]:
    path, _, key = name.rpartition(".")
    owner = root.get_submodule(path)
    return (owner._parameters if key in owner._parameters else owner._buffers), key


def apply_plan(root: nn.Module, plan: Plan, rng: str = "eager", alone: list[str] | None = None) -> None:
    """Materialize `root` piece by piece as `plan` says, then whatever is left. The tensors that
    `materialize_tensor` made alone (`slice_plan(...).sliced`) are appended to `alone`."""
    for action in plan.actions:
        if action[0] == "tensor":
            table, key = _owner(root, action[1])
            if alone is not None and slice_plan(table[key]).sliced:
                alone.append(action[1])
            table[key] = materialize_tensor(table[key], rng=rng)
        elif action[0] == "subtree":
            materialize_module(root.get_submodule(action[1]), buffers_only=action[2], rng=rng)
        else:
            chosen = root.get_submodule(action[1])
            materialize_module(root, check_fn=lambda module: module is chosen, rng=rng)
    materialize_module(root, rng=rng)


def _materialized(program: Program, how: str, materialize) -> tuple[nn.Module, list[torch.Tensor]]:  # noqa: ANN001
    module, externals = build_deferred(program)
    rng = torch.get_rng_state()
    try:
        materialize(module)
    except (DeferredInitError, MaterializationError) as error:
        raise Refused(error, "materialization", program) from error
    if not torch.equal(torch.get_rng_state(), rng):
        raise Mismatch(f"{how} materialization moved the global RNG\n{program!r}")
    return module, externals


def check_full(program: Program, expected: Snapshot) -> None:
    module, externals = _materialized(program, "full", materialize_module)
    _raise_if(differences(expected, snapshot(module, externals)), program, "full materialize_module")
    if is_deferred(module):
        raise Mismatch(f"module still deferred after materialize_module\n{program!r}")


def check_plan(program: Program, plan: Plan, expected: Snapshot) -> None:
    alone: list[str] = []
    module, externals = _materialized(program, "planned", lambda m: apply_plan(m, plan, alone=alone))
    _raise_if(differences(_made_alone(expected, alone), snapshot(module, externals)), program, f"{plan!r}")


def check_fast(program: Program, plan: Plan, expected: Snapshot) -> None:
    """rng="fast": layouts, sharing and ties as eager; values independent of the materialization
    order (the planned materialization equals the one-call one, bit for bit)."""
    full, full_externals = _materialized(program, "fast", lambda m: materialize_module(m, rng="fast"))
    whole = snapshot(full, full_externals)
    _raise_if(differences(expected, whole, values=False), program, "rng='fast' full materialize_module")
    alone: list[str] = []
    planned, externals = _materialized(program, "fast planned", lambda m: apply_plan(m, plan, "fast", alone))
    _raise_if(differences(_made_alone(whole, alone), snapshot(planned, externals)), program,
              f"rng='fast' {plan!r} vs one call")


def check_single(program: Program, name: str, expected: Snapshot) -> None:
    sliced: list[bool] = []

    def only(module: nn.Module) -> None:
        table, key = _owner(module, name)
        sliced.append(slice_plan(table[key]).sliced)
        table[key] = materialize_tensor(table[key])

    module, externals = _materialized(program, "single-tensor", only)
    expected = _made_alone(expected, [name] if sliced[0] else [])
    _raise_if(differences(expected, snapshot(module, externals), only=[name]), program, f"single tensor {name!r}")


def _view_or_eagers_error(tensor: torch.Tensor, eager: torch.Tensor) -> torch.Tensor | None:
    """`tensor[1:]`, or None when autograd refuses that view of it exactly as it refuses eager's
    (an in-place-modified output of a multi-output view such as `unbind`); any other difference
    is a mismatch."""
    try:
        return tensor[1:]
    except RuntimeError as error:
        try:
            eager[1:]
        except RuntimeError as eager_error:
            if str(eager_error) == str(error):
                return None
        raise Mismatch(f"t[1:] of a deferred tensor raised where eager's did not: {error}") from error


def check_rows(program: Program, eager: nn.Module) -> int:
    """Rows [1, n) of each slot with n >= 2, drawn alone where `draw_rows` can, and made as the view
    `t[1:]` by `materialize_tensor`, equal eager's rows bit for bit (dtype and shape too); returns how
    many were drawn alone."""
    module, _ = build_deferred(program)
    expected = dict(slots(eager))
    drawn = 0
    for name, tensor in slots(module):
        if not is_fake(tensor) or tensor.dim() == 0 or tensor.shape[0] < 2:
            continue
        want = expected[name].detach()[1:]
        rng = torch.get_rng_state()
        try:
            rows = draw_rows(tensor, 1, tensor.shape[0], name=name)
            rows_view = _view_or_eagers_error(tensor, expected[name])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", WholeBaseWarning)
                view = None if rows_view is None else materialize_tensor(rows_view)
        except (DeferredInitError, MaterializationError) as error:
            raise Refused(error, "materialization", program) from error
        if not torch.equal(torch.get_rng_state(), rng):
            raise Mismatch(f"rows of {name!r} moved the global RNG\n{program!r}")
        for how, got in (("drawn alone", rows), ("as a view t[1:]", view)):
            if got is None:
                continue
            if (got.dtype, got.shape) != (want.dtype, want.shape) or not _same_bits(got, want):
                raise Mismatch(f"rows [1, {tensor.shape[0]}) of {name!r} {how} differ from eager's\n{program!r}")
        drawn += rows is not None
    return drawn


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    def flat(t: torch.Tensor) -> torch.Tensor:  # a fresh 1-D copy: strides 1 even for size-1 views
        return torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1)).view(torch.uint8)

    return a.numel() == 0 or torch.equal(flat(a), flat(b))


def _made_alone(expected: Snapshot, names: list[str]) -> Snapshot:
    """`expected` with the views `names` as `materialize_tensor` makes them alone (`slice_plan`'s
    `sliced`): documented as eager's view bit for bit in a storage of its own, so each starts at
    offset 0, its storage holds just its elements (a 30 GB base is not made to hand out one
    expert's rows), and it shares that storage with no other slot but the other names of the same
    tensor (its tie group: materialize_tensor's memo gives them the same object)."""
    if not names:
        return expected
    alone = set(names)
    for group in expected.ties:
        if alone & group:
            alone |= group
    tensors = dict(expected.tensors)
    for name in alone:
        facts = tensors[name]
        own_bytes = math.prod(facts.shape) * facts.dtype.itemsize
        tensors[name] = dataclasses.replace(facts, storage_offset=0, storage_nbytes=own_bytes)
    own_groups = {group for group in expected.ties if group <= alone}
    sharing = {group - alone for group in expected.sharing} | own_groups
    return dataclasses.replace(expected, tensors=tensors, sharing=frozenset(g for g in sharing if len(g) > 1))


def _raise_if(found: list[str], program: Program, how: str) -> None:
    if found:
        raise Mismatch(f"{how}: " + "\n  ".join(["eager and deferred differ", *found]) + f"\n{program!r}")


def check_program(program: Program, plan: Plan | None = None, single: str | None = None) -> Snapshot:
    """Run every comparison for `program`; raises Mismatch (listing the differences), Refused
    (explorer raised; see `check_outcome`), or returns the eager snapshot."""
    eager, externals = build_eager(program)
    expected = snapshot(eager, externals)
    check_full(program, expected)
    if plan is not None:
        check_plan(program, plan, expected)
        check_fast(program, plan, expected)
    if single is not None:
        check_single(program, single, expected)
    return expected


def check_outcome(program: Program, plan: Plan | None = None, single: str | None = None) -> Verdict | None:
    """`check_program`, judged: None when deferred equals eager, the verdict of a promised refusal
    (with a clear message, at a step where it is promised); anything else raises Mismatch."""
    try:
        check_program(program, plan, single)
    except Refused as refused:
        if not refused.promised:
            raise Mismatch(f"{refused.verdict.problem}: {refused}") from refused.error
        return refused.verdict
    return None
