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


def test_confirm_materializes_what_was_asked_about_not_what_is_selected_when_it_is_pressed(ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 100)  # nothing fits: every click asks
    ui.select("blocks.0")
    ui.bar.click("selection")
    asked = ui.bar.confirm_text.value
    ui.select("head")  # the user moves on while the question is still on screen
    ui.bar.device.value = "meta"
    ui.bar.confirm().join()
    assert asked.startswith("selection: ") and " on cpu " in asked
    assert not explorer.is_deferred(ui.module.blocks[0].attn) and ui.module.blocks[0].attn.weight.device.type == "cpu"
    assert explorer.is_deferred(ui.module.head)


def test_a_small_click_that_fits_starts_at_once(ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 1 << 40)
    ui.select("head")
    ui.bar.click("selection").join()
    assert ui.bar.confirm_box.layout.display == "none"
    assert not explorer.is_deferred(ui.module.head)


def test_the_preview_says_how_many_bytes_it_reads_from_which_checkpoint_files(disk_ui, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 10 << 30)
    monkeypatch.setattr(MaterializeBar, "throughput", None)
    disk_ui.select("model.layers.0")
    # bfloat16 on disk: attention 512 + 256 + 256 + 512 B in shard 1; mlp 3 × 1024 B and two 32 B norms in shard 2
    assert disk_ui.bar.preview.value.startswith(
        "selection: 9 tensors, 9.1 KiB on cpu — reads 4.6 KiB from 2 files (model-00002-of-00004.safetensors: "
        "3.1 KiB, model-00001-of-00004.safetensors: 1.5 KiB) — fits (10.0 GiB free)")
    result = disk_ui.materialize_preview("whole module")
    assert (result.tensors, result.reads) == (23, (
        ("model-00003-of-00004.safetensors", 3936), ("model-00002-of-00004.safetensors", 3904),
        ("model-00001-of-00004.safetensors", 3584), ("model-00004-of-00004.safetensors", 2048)))
    assert "reads 13.2 KiB from 4 files (model-00003-of-00004.safetensors: 3.8 KiB, " in result.text()
    assert ", 1 more)" in result.text()


def test_reads_feeding_two_selected_names_are_counted_once():
    tensors = pd.DataFrame({"name": ["a", "b", "c"], "module": ["x", "x", "y"], "state": ["disk", "disk", "fake"],
                            "storage_id": [0, 1, 2], "bytes": [8, 8, 4]})
    reads = pd.DataFrame({"file": ["f.safetensors", "g.safetensors"], "bytes": [6, 5], "tensors": [["a", "b"], ["c"]]})
    result = preview(tensors, {"x"}, what="selection", device="meta", throughput=None, reads=reads)
    assert (result.tensors, result.bytes, result.reads) == (2, 16, (("f.safetensors", 6),))
    assert result.text() == ("selection: 2 tensors, 16 B on meta — reads 6 B from 1 file (f.safetensors: 6 B) — "
                             "no memory (shapes only) — time: known after a first materialization of 16 MiB or more")


def test_the_preview_says_how_many_bytes_come_from_which_host_and_counts_cached_ones_apart(hub_ui, local_hub, monkeypatch):
    monkeypatch.setattr(materialize_preview, "free_bytes", lambda device: 10 << 30)
    monkeypatch.setattr(MaterializeBar, "throughput", None)
    host = local_hub.endpoint.removeprefix("http://")  # 127.0.0.1:PORT here, huggingface.co in real use
    hub_ui.select("model.layers.3")
    first = hub_ui.bar.update_preview()
    assert first is not None and first.hub == ((host, 25_694_208, 0),)
    assert f" — fetches 25,694,208 B (24.5 MiB) from {host}, 0 B cached — fits (10.0 GiB free)" in first.text()
    hub_ui.materialize_selected(wait=True)
    hub_ui.release_selected()  # fake again; its bytes stay in the range cache
    again = hub_ui.bar.update_preview()
    assert again is not None and again.hub == ((host, 0, 25_694_208),)
    assert f" — fetches 0 B from {host}, 24.5 MiB cached" in again.text()
