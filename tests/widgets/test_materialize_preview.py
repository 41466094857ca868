"""Before a click materializes anything, the bar says what will happen; large clicks ask first."""

from __future__ import annotations

import pandas as pd

import explorer
from widgets import materialize_preview
from widgets.materialize_bar import MaterializeBar
from widgets.materialize_preview import MaterializePreview, preview


def test_the_preview_follows_the_selection_and_the_device(ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: None if device == "meta" else 10 << 30)
    monkeypatch.setattr(MaterializeBar, "throughput", None)
    ui.bar.update_preview("whole module")  # what the explorer shows while nothing is selected
    assert ui.bar.preview.value == ("whole module: 20 tensors, 1.0 KiB on cpu — fits (10.0 GiB free) — time: "
                                    "known after a first materialization of 16 MiB or more")
    ui.select("head")  # tied to embed: 160 B, one storage
    assert ui.bar.preview.value.startswith("selection: 1 tensor, 160 B on cpu — fits (10.0 GiB free)")
    ui.bar.device.value = "meta"
    assert ui.bar.preview.value.startswith("selection: 1 tensor, 160 B on meta — no memory (shapes only)")


def test_time_comes_from_the_last_measured_throughput(monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 1 << 40)
    tensors = pd.DataFrame({"name": ["a", "b", "c"], "module": ["x", "x", "y"], "state": ["fake", "fake", "fake"],
                            "storage_id": [0, 0, 1], "bytes": [300 << 20, 300 << 20, 100 << 20]})
    result = preview(tensors, None, what="whole module", device="cpu", throughput=200 << 20)
    assert (result.tensors, result.bytes, result.seconds) == (3, 400 << 20, 2.0)  # storage 0 counted once
    assert result.text().endswith("— about 2.0 s at the last measured 200.0 MiB/s")


def test_a_click_that_does_not_fit_asks_first_and_a_big_one_too(ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 100)  # 100 bytes free
    ui.select("blocks.0")  # 416 B
    assert ui.bar.click("selection") is None
    assert ui.bar.confirm_box.layout.display is None
    assert ui.bar.confirm_text.value.endswith("This does not fit the free memory: materialize anyway?")
    assert explorer.is_deferred(ui.module.blocks[0])
    ui.bar.keep_button.click()
    assert ui.bar.confirm_box.layout.display == "none" and ui.bar.status.value == "not materialized"
    ui.bar.click("selection")
    ui.bar.confirm().join()
    assert not explorer.is_deferred(ui.module.blocks[0].attn)
    big = MaterializePreview("selection", "cpu", 1, 5 << 30, 1 << 40, None)
    assert big.fits and big.needs_confirmation  # over CONFIRM_ABOVE_BYTES


def test_a_small_click_that_fits_starts_at_once(ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 1 << 40)
    ui.select("head")
    ui.bar.click("selection").join()
    assert ui.bar.confirm_box.layout.display == "none"
    assert not explorer.is_deferred(ui.module.head)
