"""Materialize bar: target device, RNG mode, buttons, per-tensor progress, cancel, status line,
the memory materialized tensors hold, which "Release selected" gives back, and "Save checkpoint…",
which writes the module to a directory (`explorer.save_checkpoint`, safetensors or DCP) with the
same progress bar and Cancel, leaving the module deferred.

Calls `explorer.materialize_module(..., progress=..., on_step=...)`; the step line shows the replay's
steps as they pass (with rng="eager" first the generator jump to eager's states — how many jumps,
how many draws, how long — then the replay of the ops); the progress callback updates the bar and
raises `MaterializationCancelled` once Cancel was pressed, which the engine lets through before it
changes anything (all or nothing). The work runs on a background thread so the kernel stays idle
and can deliver the Cancel click; `wait=True` runs it on the caller's thread instead. Releasing
(`explorer.release_module`) only swaps tensors back, so it runs on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ipywidgets as w
import pandas as pd
import torch
import traitlets
from torch import nn

import explorer
from explorer.replay.rng import RngMode
from explorer.replay.save import SaveFormat

from .formatting import bytes_text
from .materialize_preview import MaterializePreview

_STEP_NAMES = {"rng": "generator jump", "replay": "replay"}
THROUGHPUT_MIN_BYTES = 16 << 20  # a materialization this large sets the preview's bytes per second


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
    Traitlets `done`, `total`, `done_bytes`, `total_bytes` mirror the last progress report;
    `steps` lists the steps of the current materialization as "step: detail" lines; `running` is
    true while a materialization is under way.
    """

    done = traitlets.Int(0)
    total = traitlets.Int(0)
    done_bytes = traitlets.Int(0)
    total_bytes = traitlets.Int(0)
    running = traitlets.Bool(False)
    steps = traitlets.List(traitlets.Unicode())

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
        self.device = w.Dropdown(
            options=target_devices(), value="cpu", description="device", layout=w.Layout(width="180px")
        )
        self.device.add_class("de-device")
        self.rng = w.Dropdown(
            options=[("eager (bit-identical to eager construction)", "eager"), ("fast (per-op seeds)", "fast")],
            value="eager",
            description="rng",
            layout=w.Layout(width="320px"),
        )
        self.rng.add_class("de-rng")
        self.selected_button = w.Button(
            description="Materialize selected", button_style="primary", layout=w.Layout(width="auto")
        )
        self.selected_button.add_class("de-materialize-button")
        self.selected_button.add_class("de-materialize-selected")
        self.all_button = w.Button(description="Materialize all", layout=w.Layout(width="auto"))
        self.all_button.add_class("de-materialize-button")
        self.all_button.add_class("de-materialize-all")
        self.release_button = w.Button(
            description="Release selected",
            layout=w.Layout(width="auto"),
            tooltip="the selected modules' materialized tensors become fake again and their memory is returned",
        )
        self.release_button.add_class("de-release-selected")
        self.cancel_button = w.Button(
            description="Cancel", disabled=True, button_style="warning", layout=w.Layout(width="auto")
        )
        self.cancel_button.add_class("de-cancel-button")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="tensors")
        self.progress.add_class("de-progress")
        self.progress_text = w.Label("")
        self.progress_text.add_class("de-progress-text")
        self.step = w.Label("")
        self.step.add_class("de-step")
        self.status = w.Label("")
        self.status.add_class("de-status")
        self.held = w.Label("")
        self.held.add_class("de-held")
        self.preview = w.Label("")
        self.preview.add_class("de-preview")
        self.confirm_button = w.Button(description="Confirm", button_style="danger", layout=w.Layout(width="auto"))
        self.confirm_button.add_class("de-confirm-button")
        self.keep_button = w.Button(description="Don't", layout=w.Layout(width="auto"))
        self.keep_button.add_class("de-confirm-cancel")
        self.confirm_text = w.Label("")
        self.confirm_text.add_class("de-confirm-text")
        self.confirm_box = w.HBox(
            [self.confirm_text, self.confirm_button, self.keep_button], layout=w.Layout(display="none")
        )
        self.confirm_box.add_class("de-confirm")
        self._pending: tuple | None = None  # the click waiting for confirmation
        self.selected_button.on_click(lambda _: self.click("selection"))
        self.all_button.on_click(lambda _: self.click("whole module"))
        self.release_button.on_click(lambda _: self.release_selected())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.confirm_button.on_click(lambda _: self.confirm())
        self.keep_button.on_click(lambda _: self._hide_confirmation("not materialized"))
        self.save_directory = w.Text(
            value="",
            placeholder="directory to write the checkpoint into",
            description="save to",
            layout=w.Layout(width="360px"),
        )
        self.save_directory.add_class("de-save-directory")
        self.save_format = w.Dropdown(
            options=[
                ("safetensors (Hugging Face layout)", "safetensors"),
                ("DCP (torch.distributed.checkpoint)", "dcp"),
            ],
            value="safetensors",
            description="format",
            layout=w.Layout(width="320px"),
        )
        self.save_format.add_class("de-save-format")
        self.save_button = w.Button(
            description="Save checkpoint…",
            layout=w.Layout(width="auto"),
            tooltip="write the module's tensors in eager's values, one at a time; the module stays as it is",
        )
        self.save_button.add_class("de-save-button")
        self.save_button.on_click(lambda _: self.save())
        self.device.observe(lambda _: self.update_preview(), names="value")
        self.error: BaseException | None = None
        self.disabled_reason = ""
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_texts: list[str] = []
        super().__init__(
            [
                w.HBox(
                    [
                        self.device,
                        self.rng,
                        self.selected_button,
                        self.release_button,
                        self.all_button,
                        self.cancel_button,
                    ],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                w.HBox(
                    [self.save_directory, self.save_format, self.save_button], layout=w.Layout(flex_flow="row wrap")
                ),
                self.preview,
                self.confirm_box,
                w.HBox([self.progress, self.progress_text]),
                self.step,
                self.status,
                self.held,
            ]
        )
        self.add_class("de-materialize-bar")

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
            self._pending = (what,)
            reason = "does not fit the free memory" if not result.fits else "is large"
            self.confirm_text.value = f"{result.text()}. This {reason}: materialize anyway?"
            self.confirm_box.layout.display = None
            return None
        return self.materialize_selected() if what == "selection" else self.materialize_all()

    def confirm(self) -> threading.Thread | None:
        """The user confirmed the pending click."""
        if self._pending is None:
            return None
        (what,) = self._pending
        self._hide_confirmation("")
        return self.materialize_selected() if what == "selection" else self.materialize_all()

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
        (eager tensors are not counted: releasing cannot give them back)."""
        held = storages.loc[storages["state"] == "materialized", "bytes"]
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

    def _start(self, check_fn: Callable[[nn.Module], bool] | None, what: str, wait: bool) -> threading.Thread | None:
        if self.disabled_reason:
            self._set_status(self.disabled_reason, error=True)
            return None
        device: str = self.device.value
        rng: RngMode = self.rng.value  # the dropdown offers RngMode's values only
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

    def _step(self, step: str, detail: str) -> None:
        if self._cancel.is_set():
            raise MaterializationCancelled()
        self.steps = [*self.steps, f"{step}: {detail}"]
        self._step_texts = [*self._step_texts, f"step {len(self.steps)} — {_STEP_NAMES.get(step, step)}: {detail}"]
        self.step.value = "  |  ".join(self._step_texts)

    def _run(self, check_fn: Callable[[nn.Module], bool] | None, what: str, device: str, rng: RngMode) -> None:
        started = time.perf_counter()
        try:
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
        if self.total_bytes >= THROUGHPUT_MIN_BYTES and elapsed > 0:  # small ones measure overheads
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
