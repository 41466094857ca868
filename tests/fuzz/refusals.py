"""The refusals the engine promises, and how a deferred run's error is judged against them.

A program's deferred run either equals eager bit for bit, or stops with one of explorer's errors at
a step it cannot honour, with a message that says why and what to do. `PROMISED` lists those
situations: the error class, a fragment of the reason and one of the remedy that the message must
contain, and where the error may come from (`"construction"`, `"materialization"`, or the kind of
the step after construction that raised it). Any other error, anywhere else, is a failure; so is a
promised error whose message lost its reason or its remedy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from explorer import DeferredInitError, MaterializationError
from tests.fuzz.program import AFTER_OPS

Phase = str  # "construction", "materialization", or the kind of an after step ("copy_slot", ...)


@dataclass(frozen=True)
class Refusal:
    """One promised refusal: what the user did, and what the error must say."""

    situation: str
    error: tuple[type[Exception], ...]
    why: str  # regex the message must match: the reason
    fix: str  # regex the message must match: what to do instead
    phases: tuple[Phase, ...]  # where it may be raised


# Writes into a caller's tensor inside the constructor: eager would change the caller's memory,
# which a recording cannot defer (README "Limitations", tests/explorer/test_bad_input.py). Generated
# constructors never do this (generate.py), so at "construction" it is never what a program earns.
CALLERS_TENSOR_WRITE = Refusal(
    "an in-place write into a caller's tensor (or a view of one) inside the constructor",
    (DeferredInitError,),
    why=r"writes in place into (a view of )?a real tensor",
    fix=r"clone it first",
    phases=(),
)
# After construction: a deferred tensor's values written into a real tensor (a module built outside
# any deferred scope; `resize_token_embeddings` copying old rows into its new real embedding). The
# remedy is not the constructor's ("clone it before deferred_init") but to build the new module
# deferred too, or to materialize first.
REAL_TENSOR_WRITE_AFTER = Refusal(
    "a deferred tensor written into a real tensor after construction",
    (DeferredInitError,),
    why=r"writes (in place|values of a deferred model) into (a view of )?a real tensor",
    fix=r"materiali[sz]e|explorer\.deferred",
    phases=("copy_slot", "new_from", "load", "reinit", "parametrize"),
)
# One aten op over fakes of two recordings (two deferred_init calls, or a deferred model and a
# `deferred()` block) that writes into or views the other recording's tensor beside its own, or
# draws random numbers on it alone (note [Reading another recording] in record/foreign.py). Reads
# across recordings are recorded, so generated programs (copies out of the other model) never earn it.
TWO_RECORDINGS = Refusal(
    "an op mixing tensors of two deferred recordings",
    (DeferredInitError,),
    why=r"tensors of two deferred (modules|recordings) cannot be mixed",
    fix=r"materiali[sz]e",
    phases=("copy_slot", "new_from"),
)
# A caller's inference tensor read at construction: it has no version counter, so a later change
# to it cannot be detected (replay/preflight.py).
INFERENCE_EXTERNAL = Refusal(
    "a recorded op read a caller's inference tensor",
    (MaterializationError,),
    why=r"is an inference tensor: its in-place changes cannot be detected",
    fix=r"create it outside torch\.inference_mode\(\)",
    phases=("materialization",),
)
# A caller's tensor read at construction and written for real afterwards (copy_slot into a
# buffer that is a view of it): replay would read the new values (replay/preflight.py).
EXTERNAL_CHANGED = Refusal(
    "a caller's tensor read by recorded ops was changed in place afterwards",
    (MaterializationError,),
    why=r"was modified in place after deferred_init",
    fix=r"clone|materiali[sz]e (it )?before",
    phases=("materialization",),
)

# A random op recorded after the real generator moved (eager draws, set_rng_state) behind a deferred
# random op whose draw count depends on its values (randn of fewer than 16 elements, randperm), or
# one that may read the generator's cached normal sample that eager code set: eager's generator
# position (or that sample) there is unknowable. Raised when the op is recorded, or at
# materialization for a deferred() block's start (the engine's RNG ledger is new: re-check).
RNG_POSITION_UNKNOWN = Refusal(
    "eager's generator position behind a value-dependent deferred draw cannot be known",
    (DeferredInitError, MaterializationError),
    why=r"eager's (state there cannot be known|value of it is not known)",
    fix=r"torch\.manual_seed",
    phases=("materialization", *AFTER_OPS),
)

# `explorer.deferred(model)` (a step that makes a module "in the model") joins the model's own
# recording; a model every slot of which is a caller's real tensor has no recording to join.
NO_RECORDING_TO_JOIN = Refusal(
    "explorer.deferred(model) of a model that holds no deferred tensor",
    (DeferredInitError,),
    why=r"holds no deferred tensor",
    fix=r"run the code directly|explorer\.deferred\(\)",
    phases=("new_linear", "new_from"),
)

PROMISED: tuple[Refusal, ...] = (
    CALLERS_TENSOR_WRITE, REAL_TENSOR_WRITE_AFTER, TWO_RECORDINGS, INFERENCE_EXTERNAL, EXTERNAL_CHANGED,
    RNG_POSITION_UNKNOWN, NO_RECORDING_TO_JOIN,
)


@dataclass(frozen=True)
class Verdict:
    """How an error of the deferred run is judged: the refusal it is, or why it is a failure."""

    refusal: Refusal | None
    problem: str  # "" for a promised refusal with a clear message


def judge(error: BaseException, phase: Phase) -> Verdict:
    """Match `error`, raised at `phase` of a deferred run, against the promised refusals."""
    message = str(error)
    matching = [r for r in PROMISED if isinstance(error, r.error) and re.search(r.why, message)]
    if not matching:
        return Verdict(None, f"unpromised {type(error).__name__} at {phase}")
    here = [r for r in matching if phase in r.phases]
    if not here:
        promised_at = matching[0].phases or "no generated step"
        return Verdict(matching[0], f"promised refusal ({matching[0].situation}) raised at {phase}, "
                                    f"where it is not promised (only at {promised_at})")
    refusal = here[0]
    if not re.search(refusal.fix, message):
        return Verdict(refusal, f"promised refusal ({refusal.situation}) does not say what to do "
                                f"(no /{refusal.fix}/ in the message)")
    return Verdict(refusal, "")
