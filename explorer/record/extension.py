"""Recording what users do to a deferred module after `deferred_init` returned.

Between construction and materialization people cast (`.half()`, `.to(torch.bfloat16)`), move
(`.to("meta")`), load checkpoints (`load_state_dict`), re-initialize (`nn.init.normal_(m.weight)`).
Each of those is aten ops on the module's fake tensors. A `DeferredTensor` that receives an op while
no recording runs on this thread hands it to its graph's `Recorder`, which re-opens the recording
(scope, fake mode, recording mode) for that one op: the op lands in the same graph, after the
constructor's ops, and replays like any other. So materializing gives what eager construction
followed by the same calls gives, and a checkpoint's `copy_` makes the init ops it overwrites dead
(skipped, their random numbers jumped over).

Note: [Recording after deferred_init] only ops that reach the dispatcher are seen. Metadata-only
changes need no op (`requires_grad_` is read from the fake when it materializes); `.data = x` swaps
are detected on next use, as during construction.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._torch_compat.dispatch import tree_flatten
from .._torch_compat.fake import FakeTensorMode
from .modes import RecordingDispatchMode
from .scope import RecordingScope, ValueReader, recording

if TYPE_CHECKING:
    from .builder import GraphBuilder


@dataclass
class Recorder:
    """What it takes to record more ops into a graph whose constructor has returned."""

    builder: GraphBuilder
    read_value: ValueReader
    fake_mode: FakeTensorMode
    lock: threading.RLock

    def run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run aten `func` recorded into this graph; the fakes it touched are stamped afresh."""
        graph = self.builder.graph
        with self.lock:
            with (
                recording(RecordingScope(graph, self.read_value)),
                self.fake_mode,
                RecordingDispatchMode(self.builder, self.read_value, self.fake_mode),
            ):
                out = func(*args, **kwargs)
            self.builder.settle([*tree_flatten((args, kwargs))[0], *tree_flatten(out)[0]])
        return out
