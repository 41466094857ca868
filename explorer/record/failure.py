"""What went wrong when a constructor failed under `deferred_init`, in the fields a person reads first.

A failing constructor deep inside torch produces a 40-frame traceback whose useful line is at the
bottom. `failure_report` pulls out the op that could not run, the chain of module constructors
that were running, the user's source line and the reason, so a notebook can show those and keep
the traceback one click away.
"""

from __future__ import annotations

import traceback as traceback_module
from dataclasses import dataclass

from ..errors import DeferredInitError
from .source import innermost_user_frame, module_chain, traceback_frames

SHORT_TEXT_CHARS = 300


@dataclass(frozen=True)
class FailureReport:
    """One failed `deferred_init`, as text fields (empty string where unknown)."""

    exception: str  # the exception class name
    op: str  # the aten op that could not run ("" when the constructor itself raised)
    module_chain: str  # e.g. "RegNet.s1(RegStage).b1(Bottleneck)"
    source: str  # "path/to/model.py:137 in generate_regnet"
    code: str  # that source line
    reason: str  # one line: why
    short_text: str  # the first line of the message, cut to SHORT_TEXT_CHARS
    traceback: str  # the full formatted traceback


def failure_report(error: BaseException) -> FailureReport:
    """The report of `error` as raised by `deferred_init` (or by the constructor it ran)."""
    frames = traceback_frames(error.__traceback__)
    source = innermost_user_frame(frames)
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    reason = getattr(error, "reason", None) if isinstance(error, DeferredInitError) else None
    return FailureReport(
        exception=type(error).__name__,
        op=(getattr(error, "op", None) or "") if isinstance(error, DeferredInitError) else "",
        module_chain=module_chain(frames),
        source=str(source) if source else "",
        code=source.line if source else "",
        reason=reason or f"{type(error).__name__}: {first}",
        short_text=first if len(first) <= SHORT_TEXT_CHARS else first[: SHORT_TEXT_CHARS - 1] + "…",
        traceback="".join(traceback_module.format_exception(error)),
    )
