"""Random constructor programs: deferred_init + materialization equals eager construction.

Every program ends equal to eager construction, or refused as tests/fuzz/refusals.py promises.
CI runs a fixed, derandomized budget (`EXPLORER_FUZZ_EXAMPLES`, default 300 programs); `make fuzz`
raises it (and `EXPLORER_FUZZ_SEED` explores a different part of the space). Any failure found is
pinned as a named test in tests/fuzz/test_fuzz_regressions.py.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from tests.fuzz.compare import module_paths, snapshot
from tests.fuzz.differential import (
    Mismatch,
    Refused,
    build_eager,
    check_fast,
    check_full,
    check_plan,
    check_rows,
    check_single,
)
from tests.fuzz.generate import plans, programs
from tests.fuzz.program import AFTER_RNG_OPS, AFTER_WORLD_OPS, FACTORY_OPS, INPLACE_OPS, VIEW_OPS

EXAMPLES = int(os.environ.get("EXPLORER_FUZZ_EXAMPLES", "300"))
SEED = os.environ.get("EXPLORER_FUZZ_SEED")


def _fuzz_settings(test):  # noqa: ANN001, ANN202
    configured = settings(
        max_examples=EXAMPLES,
        derandomize=SEED is None,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )(test)
    return hypothesis_seed(int(SEED))(configured) if SEED is not None else configured


def _bucket(count: int) -> str:
    return "0" if count == 0 else "1-2" if count <= 2 else "3-9" if count <= 9 else "10+"


@_fuzz_settings
@given(st.data())
def test_materialized_programs_equal_eager_construction(data: st.DataObject) -> None:
    program = data.draw(programs(), label="program")
    with torch.random.fork_rng(devices=[]):
        eager, externals = build_eager(program)
        expected = snapshot(eager, externals)
        names = list(expected.tensors)
        plan = data.draw(plans(names, module_paths(eager)), label="plan")
        single = data.draw(st.sampled_from(names), label="single tensor")
        for kind, ops in (("factory", FACTORY_OPS), ("view", VIEW_OPS), ("in-place", INPLACE_OPS)):
            event(f"{kind} steps", _bucket(program.count(ops)))
        event("value reads", _bucket(len(expected.values_read)))
        event("data-dependent steps", _bucket(program.count(("data_dependent",))))
        event("steps after construction", _bucket(len(program.after)))
        event("RNG steps after construction", _bucket(sum(s[0] in AFTER_RNG_OPS for s in program.after)))
        for kind in sorted({step[0] for step in program.after if step[0] in AFTER_WORLD_OPS}):
            event("steps after construction that make or mix modules", kind)
        event("slots", _bucket(len(names)))
        event("shared storages", _bucket(len(expected.sharing)))
        event("tie groups", _bucket(len(expected.ties)))
        try:
            check_full(program, expected)
        except Refused as refused:
            _judge(refused)
            return
        for check in (lambda: check_plan(program, plan, expected), lambda: check_fast(program, plan, expected),
                      lambda: check_single(program, single, expected),
                      lambda: event("rows drawn alone", _bucket(check_rows(program, eager)))):
            try:
                check()
            except Refused as refused:
                _judge(refused)  # a part may need the refused op even where the whole did not
        event("outcome", "equal")


def _judge(refused: Refused) -> None:
    """A promised refusal with its clear message is an outcome; any other error is a failure."""
    if not refused.promised:
        raise Mismatch(f"{refused.verdict.problem}: {refused}") from refused.error
    event("outcome", f"refused: {refused.verdict.refusal.situation}")
