"""Exception families of the engine: one class per way things go wrong.

Messages name the culprit (op, module path, tensor name, source line) because the user usually
sees them far from where the problem started: in a notebook cell that materializes a module
built minutes earlier.
"""

from __future__ import annotations


class DeferredInitError(RuntimeError):
    """Building a module under `deferred_init` failed.

    `graph` holds what was recorded up to the failing op, so the partial construction can still be
    inspected; `partial_module` the outermost module whose constructor was running (set by
    `deferred_init`), with the submodules it had assigned before the failure.
    """

    def __init__(
        self, message: str, graph: object | None = None, *, op: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.graph = graph
        self.op = op  # the aten op that could not run, when one did
        self.reason = reason  # why, in one line, when the message says more
        self.partial_module: object | None = None


class NoDataError(DeferredInitError):
    """Code asked a deferred (fake) tensor, or its storage, for bytes it does not have.

    Raised outside a recording by the ways foreign code reads memory (`data_ptr()`, `numpy()`,
    `np.asarray`, `__dlpack__`, a storage's items), e.g. from `safetensors.torch.save_file`; the message
    names the tensor and the call. `call` is that call, as the message spells it.
    """

    def __init__(self, message: str, graph: object | None = None, *, call: str) -> None:
        super().__init__(message, graph, reason=f"{call} needs bytes a deferred tensor does not have")
        self.call = call


class MaterializationError(RuntimeError):
    """Replaying recorded ops into real tensors failed; the module was left unchanged."""


class DistributedMaterializationError(MaterializationError):
    """Materializing a deferred module across ranks failed on at least one rank.

    Raised on every rank of the mesh alike, so no rank is left waiting at its next collective.
    `failures` maps each failed rank to its error (-1: the agreement itself failed, e.g. a peer
    exited).
    """

    def __init__(self, failures: dict[int, str], headline: str | None = None) -> None:
        self.failures = dict(failures)
        ranks = sorted(r for r in failures if r >= 0)
        lines = [
            headline or f"materialization failed on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        ]
        lines += [f"  rank {r}: {message}" if r >= 0 else f"  {message}" for r, message in sorted(failures.items())]
        super().__init__("\n".join(lines))


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the module: the message names the file and key.

    Raised before anything is loaded or recorded, so the module is left as it was.
    """


class ReleaseError(MaterializationError):
    """Giving a module's materialized tensors back to their deferred state was refused (a tensor was
    changed since materialization, which materializing again cannot reproduce); the module was left
    unchanged."""


class HubCheckpointError(CheckpointError, OSError):
    """A checkpoint on the Hub cannot be opened under deferred init (a pickled one, a refused or
    failed request for its headers). Also an OSError, because transformers' `from_pretrained` passes
    OSErrors from its downloads on as they are and rewords any other kind."""
