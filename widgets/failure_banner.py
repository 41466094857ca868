"""Failure banner: a constructor that failed under `deferred_init`, shown in place of a traceback.

Red, above the explorer of what was built before the failure: the op that could not run, the chain
of module constructors, the source line and the reason. The full traceback sits behind a toggle,
because the useful line of a 40-frame torch traceback is at its bottom.
"""

from __future__ import annotations

import html

import ipywidgets as w

from explorer.record.failure import FailureReport

# (label, FailureReport field) in display order; empty fields are left out.
FIELDS = (("op", "op"), ("building", "module_chain"), ("at", "source"), ("code", "code"), ("reason", "reason"))


def banner_html(report: FailureReport) -> str:
    """The banner's text as HTML: a headline, then one row per known field."""
    what = f"{report.op} could not run" if report.op else f"the constructor raised {report.exception}"
    rows = "".join(
        f'<tr class="de-failure-field" data-field="{field}"><th>{label}</th>'
        f"<td>{html.escape(getattr(report, field))}</td></tr>"
        for label, field in FIELDS
        if getattr(report, field)
    )
    return (
        f'<div class="de-failure-headline">deferred_init failed: {html.escape(what)}; '
        "below is what was built before the failure</div>"
        f'<table class="de-failure-fields">{rows}</table>'
        f'<div class="de-failure-text">{html.escape(report.short_text)}</div>'
    )


class FailureBanner(w.VBox):
    """The report as a red banner; `traceback_toggle` shows or hides the full traceback."""

    def __init__(self, report: FailureReport) -> None:
        self.report = report
        self.body = w.HTML(banner_html(report))
        self.traceback_toggle = w.ToggleButton(value=False, description="show traceback", icon="list")
        self.traceback_toggle.add_class("de-failure-traceback-toggle")
        self.traceback = w.HTML(f"<pre>{html.escape(report.traceback)}</pre>", layout=w.Layout(display="none"))
        self.traceback.add_class("de-failure-traceback")
        self.traceback_toggle.observe(self._toggle, names="value")
        super().__init__([self.body, self.traceback_toggle, self.traceback])
        self.add_class("de-failure")

    def _toggle(self, change: dict) -> None:
        self.traceback.layout.display = None if change["new"] else "none"
        self.traceback_toggle.description = "hide traceback" if change["new"] else "show traceback"
