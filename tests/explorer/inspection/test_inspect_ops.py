"""The ops table: one row per recorded op, chronological, with kinds, tensor names and owners."""

import pandas as pd

from explorer import deferred_init, inspect, materialize_module
from tests.support.inspect_models import Kinds, Tiny, table, where

COLUMNS = ["index", "op", "kind", "inputs", "outputs", "output_shapes", "output_dtypes", "modules"]
EMBED, PROJ, ROOT = ["embed", "head"], ["block.proj", "shared.proj"], [""]
F32, F16, I64 = ["float32"], ["float16"], ["int64"]
# index, op, kind, inputs, outputs, output shapes, output dtypes, modules whose tensors need it.
# Intermediates are "#<tensor id>"; the head's own weight (#2, #3) and the shift's original storage
# (#10, #11) were replaced, so no module needs the ops that made them; neither does the slice
# `base[1:]` (#12): the `.data =` swap is recorded as an alias of the base's storage itself.
TINY_OPS = [
    (0, "aten.empty.memory_format", "factory", [], ["#0"], [(4, 3)], F32, EMBED),
    (1, "aten.detach.default", "view", ["#0"], ["embed.weight"], [(4, 3)], F32, EMBED),
    (2, "aten.normal_.default", "random", ["embed.weight"], ["embed.weight"], [(4, 3)], F32, EMBED),
    (3, "aten.empty.memory_format", "factory", [], ["#2"], [(4, 3)], F32, []),
    (4, "aten.detach.default", "view", ["#2"], ["#3"], [(4, 3)], F32, []),
    (5, "aten.uniform_.default", "random", ["#3"], ["#3"], [(4, 3)], F32, []),
    (6, "aten.empty.memory_format", "factory", [], ["#4"], [(2, 2)], F32, PROJ),
    (7, "aten.detach.default", "view", ["#4"], ["block.proj.weight"], [(2, 2)], F32, PROJ),
    (8, "aten.empty.memory_format", "factory", [], ["#6"], [(2,)], F32, PROJ),
    (9, "aten.detach.default", "view", ["#6"], ["block.proj.bias"], [(2,)], F32, PROJ),
    (10, "aten.uniform_.default", "random", ["block.proj.weight"], ["block.proj.weight"], [(2, 2)], F32, PROJ),
    (11, "aten.uniform_.default", "random", ["block.proj.bias"], ["block.proj.bias"], [(2,)], F32, PROJ),
    (12, "aten.arange.default", "factory", [], ["base"], [(6,)], F32, ROOT),
    (13, "aten.slice.Tensor", "view", ["base"], ["window"], [(4,)], F32, ROOT),
    (14, "aten.empty.memory_format", "factory", [], ["#10"], [(5,)], F32, []),
    (15, "aten.detach.default", "view", ["#10"], ["#11"], [(5,)], F32, []),
    (16, "aten.slice.Tensor", "view", ["base"], ["#12"], [(5,)], F32, []),
    (17, "aten.lift_fresh.default", "external-input", ["external #0"], ["const"], [(2,)], F32, ROOT),
    (18, "aten.mul.Tensor", "external-input", ["external #1"], ["scaled"], [(3,)], F32, ROOT),
    (19, "aten.arange.default", "factory", [], ["steps"], [(3,)], I64, ROOT),
    (20, "aten.ones.default", "factory", [], ["#16"], [(2,)], F16, ROOT),
    (21, "aten.detach.default", "view", ["#16"], ["gain"], [(2,)], F16, ROOT),
    (22, "set_data", "view", ["base"], ["shift"], [(5,)], F32, ROOT),
]
# The marker of the line that issued each op (None: noticed when recording ended, no line).
TINY_OP_LINES = (["embed"] * 3 + ["head"] * 3 + ["proj"] * 6 + ["base", "window", "shift", "shift", "shift.data",
                 "const", "scaled", "steps", "gain", "gain", None])


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def test_ops_columns_are_the_documented_ones_in_order():
    assert list(inspect(deferred_init(Tiny, table())).ops.columns) == [
        "graph", "index", "op", "kind", "inputs", "outputs", "output_shapes", "output_dtypes", "modules",
        "source", "code",
    ]


def test_every_recorded_op_in_order_with_kind_tensor_names_and_owning_modules():
    ops = inspect(deferred_init(Tiny, table())).ops
    assert set(ops["graph"]) == {0}
    assert rows(ops, COLUMNS) == TINY_OPS


def test_each_op_names_the_user_line_that_issued_it_and_its_text():
    ops = inspect(deferred_init(Tiny, table())).ops
    recorded = [marker is not None for marker in TINY_OP_LINES]
    assert ops["source"][recorded].tolist() == [where(marker) for marker in TINY_OP_LINES if marker]
    assert ops["source"][22:].isna().all() and ops["code"][22:].isna().all()  # the set_data alias
    assert ops.loc[6, "code"] == "self.proj = nn.Linear(2, 2)  # line: proj"
    assert ops.loc[18, "code"] == "self.register_buffer(\"scaled\", table * 2)  # line: scaled"


def test_op_kinds_data_in_place_and_compute():
    ops = inspect(deferred_init(Kinds)).ops
    assert rows(ops, COLUMNS) == [
        (0, "aten.zeros.default", "factory", [], ["#0"], [(2, 3)], F32, ROOT),
        (1, "aten.add_.Tensor", "in-place", ["#0"], ["#0"], [(2, 3)], F32, ROOT),
        (2, "aten.linspace.default", "factory", [], ["#1"], [(3,)], F32, []),
        (3, "aten.select.int", "view", ["#1"], ["#2"], [()], F32, []),
        # `.item()` reads the value 0.5 back into Python: its output is that value, as text.
        (4, "aten._local_scalar_dense.default", "data", ["#2"], ["0.5"], [], [], []),
        (5, "aten.mul.Tensor", "compute", ["#0"], ["w"], [(2, 3)], F32, ROOT),
        (6, "aten.randn.default", "random", [], ["#4"], [(2,)], F32, ROOT),
        (7, "aten.detach.default", "view", ["#4"], ["p"], [(2,)], F32, ROOT),
    ]
    markers = ["kinds.zeros", "kinds.add_", "kinds.item", "kinds.item", "kinds.item", "kinds.mul",
               "kinds.randn", "kinds.randn"]
    assert ops["source"].tolist() == [where(marker) for marker in markers]


def test_an_eager_module_has_no_recorded_ops():
    ops = inspect(Tiny(table())).ops
    assert len(ops) == 0
    assert list(ops.columns)[:3] == ["graph", "index", "op"]


def test_a_materialized_tensor_still_owns_the_ops_of_its_closure():
    # Partly materialized: the graph is still reachable from the other fakes.
    module = deferred_init(Tiny, table())
    materialize_module(module.block)
    ops = inspect(module).ops
    assert rows(ops, COLUMNS) == TINY_OPS
    assert ops.loc[10, "modules"] == PROJ


def test_an_op_issued_through_a_deprecation_wrapper_names_the_callers_line():
    # torch wraps functions (`torch.ao.quantization.quantize_dynamic`) in typing_extensions'
    # `@deprecated`: its wrapper frame, between torch and the caller, was taken for the user's line
    import types

    import pytest
    import torch
    from typing_extensions import deprecated

    normalize = torch.nn.functional.normalize  # a fresh function over its code: torch's own is left alone
    old_normalize = deprecated("use normalize")(
        types.FunctionType(normalize.__code__, normalize.__globals__, "normalize", normalize.__defaults__)
    )

    def build() -> torch.nn.Module:
        module = torch.nn.Linear(2, 2)
        with pytest.warns(DeprecationWarning):
            module.register_buffer("unit", old_normalize(module.weight.detach()))  # the line the ops name
        return module

    ops = inspect(deferred_init(build)).ops
    line = build.__code__.co_firstlineno + 3
    normalizing = ops.loc[ops["op"].tolist().index("aten.linalg_vector_norm.default") :]
    assert set(normalizing["source"]) == {f"{__file__}:{line} in build"}
