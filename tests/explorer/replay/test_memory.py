"""The recorded graph is released once nothing needs it."""

import gc
import weakref

from torch import nn

from explorer import deferred_init, materialize_module
from explorer.record.fake import handle_of


def graph_ref(module: nn.Module) -> weakref.ref:
    return weakref.ref(handle_of(next(iter(module.parameters()))).graph)


def test_graph_is_released_when_every_tensor_is_materialized():
    module = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    graph = graph_ref(module)
    materialize_module(module[0])
    gc.collect()
    assert graph() is not None  # the batch norm still needs it
    materialize_module(module)
    gc.collect()
    assert graph() is None


def test_graph_is_released_when_the_deferred_module_is_dropped():
    module = deferred_init(nn.Linear, 4, 4)
    graph = graph_ref(module)
    del module
    gc.collect()
    assert graph() is None
