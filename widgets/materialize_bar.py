"""Materialize bar: target device, RNG mode, buttons, per-tensor progress, cancel, status line,
the memory materialized tensors hold, which "Release selected" gives back, and "Save checkpoint…",
which writes the module to a directory (`explorer.save_checkpoint`, safetensors or DCP) with the
same progress bar and Cancel, leaving the module deferred.

Calls `explorer.materialize_module(..., progress=..., on_step=...)`; the step line shows the replay's
steps as they pass (with rng="eager" first the generator jump to eager's states — how many jumps,
how many draws, how long — then the replay of the ops); the progress callback updates the bar and
raises `MaterializationCancelled` once Cancel was pressed, which the engine lets through before it
changes anything (all or nothing). Bytes fetched from the Hugging Face Hub before the replay show
on their own line, with bytes per second (`explorer.hub_fetch.reporting_fetches`); Cancel stops the
fetch between requests. The work runs on a background thread so the kernel stays idle
and can deliver the Cancel click; `wait=True` runs it on the caller's thread instead. Releasing
(`explorer.release_module`) only swaps tensors back, so it runs on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import ipywidgets as w
import pandas as pd
import torch
import traitlets
from torch import nn

import explorer
from explorer.hub_fetch import FetchProgress, reporting_fetches
from explorer.replay.rng import RngMode
from explorer.replay.save import SaveFormat

from .formatting import bytes_text
from .materialize_preview import MaterializePreview

_STEP_NAMES = {"rng": "generator jump", "replay": "replay"}
THROUGHPUT_MIN_BYTES = 16 << 20  # a materialization this large sets the preview's bytes per second
# (label, value) of the RNG-mode and checkpoint-format dropdowns: the values are RngMode's and SaveFormat's.
_RNG_CHOICES = [("eager (bit-identical to eager construction)", "eager"), ("fast (per-op seeds)", "fast")]
_SAVE_FORMAT_CHOICES = [
    ("safetensors (Hugging Face layout)", "safetensors"),
    ("DCP (torch.distributed.checkpoint)", "dcp"),
]


class MaterializationCancelled(Exception):
    """Raised from the progress callback to stop a materialization the user cancelled."""


def target_devices() -> list[str]:
    """Devices a user can materialize onto here: cpu, every present CUDA device, and meta."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu", *(f"cuda:{index}" for index in range(count)), "meta"]


class MaterializeBar(w.VBox):
    """Controls and progress for materializing the selection or the whole module.

    `selected_modules()` gives the modules whose own tensors "Materialize selected" fills;
    `on_done()` runs after a successful materialization (the explorer refreshes its views there).
    Traitlets `done`, `total`, `done_bytes`, `total_bytes` mirror the last progress report, and
    `fetched_bytes`, `fetch_bytes` the last Hub fetch report;
    `steps` lists the steps of the current materialization as "step: detail" lines; `running` is
    true while a materialization is under way.
    """

    done = traitlets.Int(0, help="tensors materialized (or saved) so far, as the last progress report said")
    total = traitlets.Int(0, help="tensors the running materialization (or save) will fill in all")
    done_bytes = traitlets.Int(0, help="bytes of the tensors done so far, as the last progress report said")
    total_bytes = traitlets.Int(0, help="bytes of all the tensors the running materialization (or save) fills")
    fetched_bytes = traitlets.Int(0, help="bytes fetched from the Hub so far by the running materialization")
    fetch_bytes = traitlets.Int(0, help="bytes the running materialization fetches from the Hub in all")
    running = traitlets.Bool(False, help="true while a materialization or a save is under way")
    steps = traitlets.List(traitlets.Unicode(), help='the current run\'s steps so far, as "step: detail" lines')

    # Bytes per second of the last materialization in this process (the preview's time estimate).
    throughput: float | None = None

    def __init__(
        self,
        module: nn.Module,
        selected_modules: Callable[[], list[nn.Module]],
        on_done: Callable[[], None],
        preview: Callable[[str, str], MaterializePreview] | None = None,
    ) -> None:
        self.module = module
        self.selected_modules = selected_modules
        self.on_done = on_done
        self.preview_of = preview  # (what: "selection" | "whole module", device) → preview
        self.error: BaseException | None = None
        self.disabled_reason = ""
        # the click waiting for confirmation: (what, chosen module ids or None, device, rng)
        self._pending: tuple[str, set[int] | None, str, RngMode] | None = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_texts: list[str] = []
        rows = [self._materialize_row(), self._save_row(), *self._report_rows()]
        self._connect_handlers()
        super().__init__(rows)
        self.add_class("de-materialize-bar")

    # -- the bar's pieces, row by row ----------------------------------------------------------------
    def _materialize_row(self) -> w.HBox:
        """Target device and RNG mode, then Materialize selected / Release selected / all / Cancel."""
        self.device = _dropdown(target_devices(), "cpu", "device", "180px", "de-device")
        self.rng = _dropdown(_RNG_CHOICES, "eager", "rng", "320px", "de-rng")
        self.selected_button = _button(
            "Materialize selected", "de-materialize-button", "de-materialize-selected", button_style="primary"
        )
        self.all_button = _button("Materialize all", "de-materialize-button", "de-materialize-all")
        self.release_button = _button(
            "Release selected",
            "de-release-selected",
            tooltip="the selected modules' materialized tensors become fake again and their memory is returned",
        )
        self.cancel_button = _button("Cancel", "de-cancel-button", disabled=True, button_style="warning")
        buttons = [self.selected_button, self.release_button, self.all_button, self.cancel_button]
        return w.HBox([self.device, self.rng, *buttons], layout=w.Layout(flex_flow="row wrap"))

    def _save_row(self) -> w.HBox:
        """Save checkpoint…: the directory to write, the format, and the button."""
        self.save_directory = _with_classes(
            w.Text(
                value="",
                placeholder="directory to write the checkpoint into",
                description="save to",
                layout=w.Layout(width="360px"),
            ),
            "de-save-directory",
        )
        self.save_format = _dropdown(_SAVE_FORMAT_CHOICES, "safetensors", "format", "320px", "de-save-format")
        self.save_button = _button(
            "Save checkpoint…",
            "de-save-button",
            tooltip="write the module's tensors in eager's values, one at a time; the module stays as it is",
        )
        return w.HBox([self.save_directory, self.save_format, self.save_button], layout=w.Layout(flex_flow="row wrap"))

    def _report_rows(self) -> list[w.DOMWidget]:
        """Below the buttons: the preview, the confirmation question (hidden until asked), the
        progress bar with its text, then the step, status and held-memory lines."""
        self.progress = _with_classes(w.IntProgress(value=0, min=0, max=1, description="tensors"), "de-progress")
        self.progress_text = _label("de-progress-text")
        self.step = _label("de-step")
        self.fetch = _label("de-fetch")
        self.status = _label("de-status")
        self.held = _label("de-held")
        self.preview = _label("de-preview")
        self.confirm_box = self._confirmation()
        progress_row = w.HBox([self.progress, self.progress_text])
        return [self.preview, self.confirm_box, progress_row, self.fetch, self.step, self.status, self.held]

    def _confirmation(self) -> w.HBox:
        """The "… materialize anyway?" question with Confirm and Don't, hidden until a large click asks it."""
        self.confirm_button = _button("Confirm", "de-confirm-button", button_style="danger")
        self.keep_button = _button("Don't", "de-confirm-cancel")
        self.confirm_text = _label("de-confirm-text")
        return _with_classes(
            w.HBox([self.confirm_text, self.confirm_button, self.keep_button], layout=w.Layout(display="none")),
            "de-confirm",
        )

    def _connect_handlers(self) -> None:
        """What each click does, and the preview following the chosen device."""
        self.selected_button.on_click(lambda _: self.click("selection"))
        self.all_button.on_click(lambda _: self.click("whole module"))
        self.release_button.on_click(lambda _: self.release_selected())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.confirm_button.on_click(lambda _: self.confirm())
        self.keep_button.on_click(lambda _: self._hide_confirmation("not materialized"))
        self.save_button.on_click(lambda _: self.save())
        self.device.observe(lambda _: self.update_preview(), names="value")

    # -- before a click does anything ----------------------------------------------------------------
    def update_preview(self, what: str = "selection") -> MaterializePreview | None:
        """Say what "Materialize selected" (or the whole module) would do on the chosen device."""
        if self.preview_of is None:
            return None
        result = self.preview_of(what, self.device.value)
        self.preview.value = result.text()
        return result

    def click(self, what: str) -> threading.Thread | None:
        """A button click: materialize at once, or first ask when the preview says it is large
        (over CONFIRM_ABOVE_BYTES) or does not fit the device's free memory."""
        result = self.update_preview(what) if self.preview_of is not None else None
        if result is not None and result.needs_confirmation:
            # what was asked about, kept: a selection or device changed before Confirm is not it
            chosen = {id(module) for module in self.selected_modules()} if what == "selection" else None
            self._pending = (what, chosen, self.device.value, self.rng.value)
            reason = "does not fit the free memory" if not result.fits else "is large"
            self.confirm_text.value = f"{result.text()}. This {reason}: materialize anyway?"
            self.confirm_box.layout.display = None
            return None
        return self.materialize_selected() if what == "selection" else self.materialize_all()

    def confirm(self) -> threading.Thread | None:
        """The user confirmed the pending click."""
        if self._pending is None:
            return None
        what, chosen, device, rng = self._pending
        self._hide_confirmation("")
        check_fn = None if chosen is None else (lambda module: id(module) in chosen)
        return self._start(check_fn, what, wait=False, device=device, rng=rng)

    def _hide_confirmation(self, message: str) -> None:
        self._pending = None
        self.confirm_box.layout.display = "none"
        if message:
            self._set_status(message, error=False)

    def disable(self, reason: str) -> None:
        """Turn materializing off for good (e.g. the constructor failed), saying why in the status."""
        self.disabled_reason = reason
        self.selected_button.disabled = self.all_button.disabled = self.save_button.disabled = True
        self._set_status(reason, error=True)

    def materialize_selected(self, wait: bool = False) -> threading.Thread | None:
        """Materialize the tensors held directly by the selected modules (see `selected_modules`)."""
        chosen = {id(module) for module in self.selected_modules()}
        if not chosen:
            self._set_status("nothing selected: tick modules in the tree first", error=False)
            return None
        return self._start(lambda module: id(module) in chosen, "selection", wait)

    def materialize_all(self, wait: bool = False) -> threading.Thread | None:
        """Materialize every deferred tensor of the module."""
        return self._start(None, "whole module", wait)

    def release_selected(self) -> None:
        """Give the selected modules' own materialized tensors back (`explorer.release_module`): they
        are fake again and their memory is returned. A tensor changed since materialization is
        refused with the engine's message, and nothing is released."""
        chosen = {id(module) for module in self.selected_modules()}
        if not chosen:
            self._set_status("nothing selected: tick modules in the tree first", error=False)
            return
        if self.running:
            self._set_status("a materialization is running: release once it is done", error=False)
            return
        before = _slot_tensors(self.module)
        try:
            explorer.release_module(self.module, check_fn=lambda module: id(module) in chosen)
        except Exception as error:  # shown in the widget; the engine left the module unchanged
            self.error = error
            self._set_status(f"release failed ({type(error).__name__}): {error}", error=True)
            return
        self.error = None
        message = _released_text(before, _slot_tensors(self.module))
        del before  # the released tensors: their memory goes once nothing else holds them
        self._refresh_then(message, self._set_status)

    def show_held(self, storages: pd.DataFrame) -> None:
        """Say how much memory materialized tensors hold, from the storages table of `explorer.inspect`
        (eager tensors are not counted: releasing cannot give them back; nor meta ones, which hold none)."""
        held = storages.loc[(storages["state"] == "materialized") & (storages["device"] != "meta"), "bytes"]
        if held.empty:
            self.held.value = "materialized tensors hold no memory"
            return
        count = len(held)
        self.held.value = (
            f"materialized tensors hold {bytes_text(int(held.sum()))} "
            f"in {count} storage{'s' * (count != 1)}: Release selected gives it back"
        )

    def cancel(self) -> None:
        """Stop the running materialization after the tensor in progress; the module stays as it was."""
        if self.running:
            self._cancel.set()
            self._set_status("cancelling after the current tensor…", error=False)

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background materialization to finish."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _start(
        self,
        check_fn: Callable[[nn.Module], bool] | None,
        what: str,
        wait: bool,
        device: str | None = None,
        rng: RngMode | None = None,
    ) -> threading.Thread | None:
        """Materialize in the background on `device` with `rng` (default: the dropdowns' now)."""
        if self.disabled_reason:
            self._set_status(self.disabled_reason, error=True)
            return None
        device = device or self.device.value
        rng = rng or self.rng.value  # the dropdown offers RngMode's values only
        return self._launch(
            f"materializing {what} on {device} (rng={rng})…", lambda: self._run(check_fn, what, device, rng), wait
        )

    def save(self, wait: bool = False) -> threading.Thread | None:
        """Save checkpoint…: write the whole module to the directory typed, in the format chosen
        (`explorer.save_checkpoint`: one tensor materialized at a time, the module left as it is),
        with this bar's progress; Cancel stops it with no partial file left under a final name."""
        directory = self.save_directory.value.strip()
        if self.disabled_reason:
            self._set_status(self.disabled_reason, error=True)
            return None
        if not directory:
            self._set_status("type the directory to save the checkpoint into first", error=False)
            return None
        chosen: SaveFormat = self.save_format.value  # the dropdown offers SaveFormat's values only
        return self._launch(
            f"saving the checkpoint to {directory} ({chosen})…", lambda: self._run_save(directory, chosen), wait
        )

    def _launch(self, message: str, work: Callable[[], None], wait: bool) -> threading.Thread | None:
        """Reset the progress, then run `work` on a background thread (or here, with `wait`)."""
        if self.running:
            self._set_status("a materialization is already running", error=False)
            return None
        self._cancel.clear()
        self.error = None
        self.running = True
        with self.hold_trait_notifications():
            self.done = self.total = self.done_bytes = self.total_bytes = 0
            self.fetched_bytes = self.fetch_bytes = 0
        self.fetch.value = ""
        self.progress.value, self.progress.max, self.progress_text.value = 0, 1, ""
        self.steps, self.step.value, self._step_texts = [], "", []
        self._set_buttons(running=True)
        self._set_status(message, error=False)
        if wait:
            work()
            return None
        self._thread = threading.Thread(target=work, name="explorer-materialize", daemon=True)
        self._thread.start()
        return self._thread

    def _run_save(self, directory: str, chosen: SaveFormat) -> None:
        try:
            written = explorer.save_checkpoint(self.module, directory, format=chosen, progress=self._progress)
        except MaterializationCancelled:
            self._finish(f"cancelled: no partial file left in {directory}", error=False)
            return
        except Exception as error:  # shown in the widget; files completed before are intact
            self.error = error
            self._finish(f"saving failed ({type(error).__name__}): {error}", error=True)
            return
        tensors = f"{self.done} tensor{'s' * (self.done != 1)}"
        files = f"{len(written)} file{'s' * (len(written) != 1)}"
        self._finish(
            f"saved {tensors} ({bytes_text(self.done_bytes)}) to {directory} as {chosen}: {files}", error=False
        )

    def _progress(self, done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        if self._cancel.is_set():
            raise MaterializationCancelled()
        self.progress.max = max(total, 1)
        self.progress.value = done
        self.progress_text.value = f"{done} / {total} tensors, {bytes_text(done_bytes)} / {bytes_text(total_bytes)}"
        with self.hold_trait_notifications():
            self.total, self.total_bytes = total, total_bytes
            self.done, self.done_bytes = done, done_bytes

    def _fetch_progress(self, report: FetchProgress) -> None:
        if self._cancel.is_set():
            raise MaterializationCancelled()
        self.fetch.value = (
            f"fetched {bytes_text(report.done_bytes)} / {bytes_text(report.total_bytes)} from {report.hosts} "
            f"at {bytes_text(report.bytes_per_second)}/s"
        )
        with self.hold_trait_notifications():
            self.fetched_bytes, self.fetch_bytes = report.done_bytes, report.total_bytes

    def _step(self, step: str, detail: str) -> None:
        if self._cancel.is_set():
            raise MaterializationCancelled()
        self.steps = [*self.steps, f"{step}: {detail}"]
        self._step_texts = [*self._step_texts, f"step {len(self.steps)} — {_STEP_NAMES.get(step, step)}: {detail}"]
        self.step.value = "  |  ".join(self._step_texts)

    def _run(self, check_fn: Callable[[nn.Module], bool] | None, what: str, device: str, rng: RngMode) -> None:
        started = time.perf_counter()
        try:
            with reporting_fetches(self._fetch_progress):
                explorer.materialize_module(
                    self.module, check_fn=check_fn, device=device, rng=rng, progress=self._progress, on_step=self._step
                )
        except MaterializationCancelled:
            self._finish(f"cancelled: {what} left as it was", error=False)
            return
        except Exception as error:  # shown in the widget; the engine left the module unchanged
            self.error = error
            self._finish(f"materialization failed ({type(error).__name__}): {error}", error=True)
            return
        elapsed = time.perf_counter() - started
        # small ones measure overheads, and meta tensors (shapes only) no work at all
        if self.total_bytes >= THROUGHPUT_MIN_BYTES and elapsed > 0 and torch.device(device).type != "meta":
            MaterializeBar.throughput = self.total_bytes / elapsed
        if self.total == 0:
            message = f"nothing to materialize in the {what}: no fake tensors left"
        else:
            tensors = f"{self.total} tensor{'s' * (self.total != 1)}"
            message = f"materialized {tensors} ({bytes_text(self.total_bytes)}) of the {what} on {device} (rng={rng})"
        self._refresh_then(message, self._finish)

    def _refresh_then(self, message: str, report: Callable[..., None]) -> None:
        """Refresh the views (`on_done`), then `report(message, error=...)`; a failed refresh is said,
        not hidden."""
        try:
            self.on_done()
        except Exception as error:
            self.error = error
            report(f"{message}; refreshing the views failed: {type(error).__name__}: {error}", error=True)
            return
        report(message, error=False)

    def _finish(self, message: str, error: bool) -> None:
        self._set_status(message, error=error)
        self._set_buttons(running=False)
        self.running = False

    def _set_buttons(self, running: bool) -> None:
        self.selected_button.disabled = self.all_button.disabled = self.release_button.disabled = running
        self.save_button.disabled = running
        self.cancel_button.disabled = not running

    def _set_status(self, message: str, error: bool) -> None:
        self.status.value = message
        if error:
            self.status.add_class("de-status-error")
        else:
            self.status.remove_class("de-status-error")


def _slot_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer name (duplicates included) with its tensor object."""
    return dict([*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)])


def _released_text(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> str:
    """The status after a release: how many tensors went back to fake, and the memory they held."""
    released = {id(tensor): tensor for name, tensor in before.items() if after[name] is not tensor}
    if not released:
        return "nothing to release in the selection: no materialized tensors"
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in released.values()}
    count = len(released)
    return (
        f"released {count} tensor{'s' * (count != 1)} ({bytes_text(sum(storages.values()))}) of the "
        "selection: fake again"
    )


_Widget = TypeVar("_Widget", bound=w.DOMWidget)


def _with_classes(widget: _Widget, *classes: str) -> _Widget:
    """`widget` with the CSS classes the stylesheet and the browser tests find it by."""
    for name in classes:
        widget.add_class(name)
    return widget


def _button(description: str, *classes: str, **options: object) -> w.Button:
    """A button as wide as its text, with its CSS classes (`options`: tooltip, style, disabled)."""
    return _with_classes(w.Button(description=description, layout=w.Layout(width="auto"), **options), *classes)


def _dropdown(options: list, value: str, description: str, width: str, css_class: str) -> w.Dropdown:
    """A labelled dropdown of `options` ((label, value) pairs or plain values), `width` wide."""
    return _with_classes(
        w.Dropdown(options=options, value=value, description=description, layout=w.Layout(width=width)), css_class
    )


def _label(css_class: str) -> w.Label:
    """An empty line of text the bar fills in later."""
    return _with_classes(w.Label(""), css_class)
