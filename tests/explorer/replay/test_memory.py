"""The recorded graph is released once nothing needs it: no fake of it, and no tensor materialized
from it (which keeps it, through the fake it replaced, for release_module)."""

import gc
import weakref

from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor, release_module
from explorer.record.fake import handle_of


def graph_ref(module: nn.Module) -> weakref.ref:
    return weakref.ref(handle_of(next(iter(module.parameters()))).graph)


def test_materialized_module_keeps_its_graph_for_release_until_it_is_dropped():
    module = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    graph = graph_ref(module)
    materialize_module(module[0])
    materialize_module(module)
    gc.collect()
    assert graph() is not None  # release_module puts its fakes back, and they replay from it
    del module
    gc.collect()
    assert graph() is None


def test_graph_is_released_when_the_deferred_module_is_dropped():
    module = deferred_init(nn.Linear, 4, 4)
    graph = graph_ref(module)
    del module
    gc.collect()
    assert graph() is None


def test_graph_is_released_when_a_released_module_is_dropped():
    module = deferred_init(nn.Linear, 4, 4)
    graph = graph_ref(module)
    release_module(materialize_module(module))
    del module
    gc.collect()
    assert graph() is None


def test_graph_is_released_when_the_last_materialized_tensor_is_dropped():
    module = deferred_init(nn.Linear, 4, 4)
    graph = graph_ref(module)
    weight = materialize_tensor(module.weight)
    del module
    gc.collect()
    assert graph() is not None  # `weight` can still be released into a module
    del weight
    gc.collect()
    assert graph() is None
