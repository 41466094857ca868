"""deferred_init pauses the cyclic garbage collector while recording and hands the recording's
objects straight to the oldest generation afterwards; the caller's collector state and frozen
objects stay as they were, and a dropped recording is still collected."""

import gc
import weakref

from torch import nn

from explorer import deferred_init
from explorer.record.fake import handle_of


def test_recording_leaves_the_collector_enabled_and_the_frozen_objects_as_they_were():
    # Nothing is frozen at start on CPython 3.10, 3.11 and 3.13; 3.12 starts with a few hundred
    # objects of its own in the permanent generation, which a recording must leave there too.
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    deferred_init(nn.Linear, 4, 4)
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_the_callers_frozen_objects_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        deferred_init(nn.Linear, 4, 4)
        # a frozen object may die meanwhile (count - 1); unfreezing them would leave none
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        deferred_init(nn.Linear, 4, 4)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_dropped_recording_is_still_collected():
    module = deferred_init(nn.Linear, 4, 4)
    graph = weakref.ref(handle_of(module.weight).graph)
    del module
    gc.collect()
    assert graph() is None
