"""Materialize bar: parity with eager construction, refreshed views, progress, errors, cancel."""

import re
import threading

import torch
from torch import nn

import explorer
import widgets
from widgets.materialize_bar import target_devices
from widgets.states import STATE_COLOURS


def state_of(ui, path):
    return next((n["state"], n["colour"]) for n in ui.tree.nodes if n["path"] == path)


def bits(tensor):
    return tensor.detach().reshape(-1).view(torch.uint8) if tensor.is_floating_point() else tensor.reshape(-1)


def snapshot(module):
    """Every parameter/buffer object by name: 'unchanged' means the very same objects."""
    return {name: t for name, t in [*module.named_parameters(remove_duplicate=False),
                                    *module.named_buffers(remove_duplicate=False)]}


def test_materialize_selected_equals_eager_bitwise_and_recolours_the_tree(net_pair):
    eager, deferred = net_pair
    ui = widgets.ExplorerWidget(deferred)
    ui.select("blocks.1")
    ui.materialize_selected(wait=True)
    eager_tensors = snapshot(eager)
    for name, tensor in snapshot(deferred).items():
        if name.startswith("blocks.1."):
            assert not explorer.is_fake(tensor), name
            assert tensor.dtype == eager_tensors[name].dtype and tensor.stride() == eager_tensors[name].stride()
            assert torch.equal(bits(tensor), bits(eager_tensors[name])), name
        else:
            assert explorer.is_fake(tensor), name
    assert state_of(ui, "blocks.1") == ("materialized", STATE_COLOURS["materialized"])
    assert state_of(ui, "blocks.1.mlp.1") == ("empty", STATE_COLOURS["empty"])
    assert state_of(ui, "blocks") == ("partly", STATE_COLOURS["partly"])
    assert state_of(ui, "") == ("partly", STATE_COLOURS["partly"])
    assert state_of(ui, "blocks.0") == ("fake", STATE_COLOURS["fake"])
    table = ui.tensors_tab.table
    assert [row[6] for row in table.rows] == ["materialized"] * 8
    assert table.row_colours == [STATE_COLOURS["materialized"]] * 8
    assert ui.bar.status.value == "materialized 8 tensors (416 B) of the selection on cpu (rng=eager)"
    assert ui.memory_tab.totals.value == \
        "selection: 416 B — by device: cpu 416 B — by state: materialized 416 B"


def test_materialize_all_keeps_ties_and_views_and_matches_eager(net_pair):
    eager, deferred = net_pair
    ui = widgets.ExplorerWidget(deferred)
    ui.materialize_all(wait=True)
    assert not explorer.is_deferred(deferred)
    assert deferred.head.weight is deferred.embed.weight
    assert deferred.window.untyped_storage().data_ptr() == deferred.positions.untyped_storage().data_ptr()
    for name, tensor in snapshot(eager).items():
        assert torch.equal(bits(snapshot(deferred)[name]), bits(tensor)), name
    assert {n["state"] for n in ui.tree.nodes} == {"materialized", "empty"}
    assert ui.bar.status.value == "materialized 19 tensors (1.0 KiB) of the whole module on cpu (rng=eager)"


def test_progress_reports_each_tensor_with_bytes(ui):
    reports = []
    ui.bar.observe(lambda _: reports.append((ui.bar.done, ui.bar.total, ui.bar.done_bytes, ui.bar.total_bytes)),
                   names="done_bytes")
    ui.select("blocks.0.mlp")
    ui.materialize_selected(wait=True)
    # mlp.0: weight 8×4, bias 8; mlp.2: weight 4×8, bias 4 (float32), completed in recording order
    assert reports == [(1, 4, 128, 304), (2, 4, 160, 304), (3, 4, 288, 304), (4, 4, 304, 304)]
    assert (ui.bar.progress.value, ui.bar.progress.max) == (4, 4)
    assert ui.bar.progress_text.value == "4 / 4 tensors, 304 B / 304 B"


def test_rng_fast_and_meta_target_are_passed_to_the_engine(ui):
    ui.select("blocks.0.attn")
    ui.bar.device.value = "meta"
    ui.bar.rng.value = "fast"
    ui.materialize_selected(wait=True)
    weight = ui.module.blocks[0].attn.weight
    assert weight.device == torch.device("meta") and not explorer.is_fake(weight)
    assert ui.bar.status.value == "materialized 2 tensors (80 B) of the selection on meta (rng=fast)"


def test_device_choices_are_cpu_present_cuda_devices_and_meta(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert target_devices() == ["cpu", "cuda:0", "cuda:1", "meta"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert target_devices() == ["cpu", "meta"]


def test_engine_error_is_shown_and_the_module_is_unchanged():
    ui = widgets.explore(lambda: nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(3)))
    before = snapshot(ui.module)
    ui.materialize_all(wait=True)
    assert ui.bar.status.value == (
        "materialization failed (MaterializationError): '1.weight' is an uninitialized lazy parameter: call the "
        "module once on an example input inside module_fn so its shape is known")
    assert "de-status-error" in ui.bar.status._dom_classes
    assert isinstance(ui.bar.error, explorer.MaterializationError)
    after = snapshot(ui.module)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert all(n["state"] in ("fake", "empty") for n in ui.tree.nodes)
    assert (ui.bar.selected_button.disabled, ui.bar.cancel_button.disabled) == (False, True)
    ui.select("0")  # the next success clears the error look
    ui.materialize_selected(wait=True)
    assert "de-status-error" not in ui.bar.status._dom_classes


def test_cancel_between_tensors_leaves_the_module_unchanged(ui):
    before = snapshot(ui.module)

    def press_cancel(_):  # once the first tensor is done
        ui.cancel()

    ui.bar.observe(press_cancel, names="done")
    ui.select("blocks")
    ui.materialize_selected(wait=True)
    assert ui.bar.done == 1 and ui.bar.total == 16
    assert ui.bar.status.value == "cancelled: selection left as it was"
    after = snapshot(ui.module)
    assert all(after[k] is before[k] for k in before) and explorer.is_deferred(ui.module.blocks[0].attn)
    assert {n["state"] for n in ui.tree.nodes} == {"fake", "empty"}
    ui.bar.unobserve(press_cancel, names="done")
    ui.materialize_selected(wait=True)  # cancelling does not stick to the next run
    assert not explorer.is_deferred(ui.module.blocks)


def test_cancel_button_stops_a_background_materialization(ui):
    first_done, go_on = threading.Event(), threading.Event()

    def hold_after_first_tensor(change):
        if change["new"] == 1:
            first_done.set()
            go_on.wait(10)

    ui.bar.observe(hold_after_first_tensor, names="done")
    ui.select("blocks.1")
    thread = ui.materialize_selected()  # background thread: the kernel stays free for the click
    assert first_done.wait(10)
    assert ui.bar.running and not ui.bar.cancel_button.disabled and ui.bar.selected_button.disabled
    ui.bar.cancel_button.click()
    go_on.set()
    thread.join(10)
    assert ui.bar.status.value == "cancelled: selection left as it was"
    assert explorer.is_deferred(ui.module.blocks[1].attn) and not ui.bar.running


def test_background_materialization_refreshes_views_when_done(ui):
    ui.select("embed")
    ui.materialize_selected().join(10)
    assert ui.tensors_tab.table.rows[0][6] == "materialized"
    assert ui.bar.status.value == "materialized 1 tensor (160 B) of the selection on cpu (rng=eager)"


def test_materialize_selected_with_nothing_selected_says_so(ui):
    assert ui.materialize_selected(wait=True) is None
    assert ui.bar.status.value == "nothing selected: tick modules in the tree first"
    assert explorer.is_deferred(ui.module)


def test_the_generator_jump_is_a_step_of_the_bar_before_the_replay(net_pair):
    _, deferred = net_pair
    ui = widgets.ExplorerWidget(deferred)
    ui.select("blocks.1")
    ui.materialize_selected(wait=True)
    assert [line.split(":")[0] for line in ui.bar.steps] == ["rng", "replay"]
    found = re.search(r"for (\d+) random ops: (\d+) jumps? over ([\d,]+) draws \([\d.]+ s\), 0 ops re-run on scratch",
                      ui.bar.steps[0])
    assert found, ui.bar.steps[0]
    # blocks.1's three Linear layers (weight, bias): 6 uniform_ fills, each on its own jumped generator;
    # past embed's normal_ (40 + 16-value tail) and blocks.0's fills (96), up to blocks.1's last (92)
    assert found.groups()[:3] == ("6", "6", "244")
    assert ui.bar.step.value.startswith("step 1 — generator jump: generator at eager's state for 6 random ops")
    assert "  |  step 2 — replay: running " in ui.bar.step.value
    ui.bar.rng.value = "fast"
    ui.materialize_all(wait=True)
    assert ui.bar.steps == []  # rng="fast" seeds each op: no generator step


def test_release_selected_puts_the_fakes_back_and_the_held_line_follows(net_pair):
    eager, deferred = net_pair
    ui = widgets.ExplorerWidget(deferred)
    fakes = snapshot(deferred)
    assert ui.bar.held.value == "materialized tensors hold no memory"
    ui.materialize_all(wait=True)
    assert ui.bar.held.value == "materialized tensors hold 1.0 KiB in 18 storages: Release selected gives it back"
    ui.select("blocks.1")
    ui.release_selected()
    assert ui.bar.status.value == "released 8 tensors (416 B) of the selection: fake again"
    assert "de-status-error" not in ui.bar.status._dom_classes
    assert ui.bar.held.value == "materialized tensors hold 608 B in 10 storages: Release selected gives it back"
    after = snapshot(deferred)
    for name, tensor in after.items():
        assert (tensor is fakes[name]) == name.startswith("blocks.1."), name
    assert state_of(ui, "blocks.1") == ("fake", STATE_COLOURS["fake"])
    assert state_of(ui, "") == ("partly", STATE_COLOURS["partly"])
    ui.materialize_all(wait=True)  # materializing again gives eager's bytes
    for name, tensor in snapshot(eager).items():
        assert torch.equal(bits(snapshot(deferred)[name]), bits(tensor)), name


def test_tensors_materialized_on_meta_hold_no_memory_and_measure_no_throughput(ui, monkeypatch):
    from widgets import materialize_bar
    from widgets.materialize_bar import MaterializeBar

    monkeypatch.setattr(MaterializeBar, "throughput", None)
    monkeypatch.setattr(materialize_bar, "THROUGHPUT_MIN_BYTES", 1)  # the toy model is small
    ui.bar.device.value = "meta"
    ui.materialize_all(wait=True)  # shapes only
    assert ui.bar.held.value == "materialized tensors hold no memory"
    assert MaterializeBar.throughput is None  # nothing was filled: no speed to estimate from
    ui.bar.device.value = "cpu"
    ui.materialize_all(wait=True)
    assert ui.bar.held.value.startswith("materialized tensors hold 1.0 KiB in 18 storages")
    assert MaterializeBar.throughput is not None


def test_release_of_a_changed_tensor_is_refused_with_the_engine_message(ui):
    ui.materialize_all(wait=True)
    weight = ui.module.blocks[0].attn.weight
    version = weight._version
    with torch.no_grad():
        weight.add_(1)
    before = snapshot(ui.module)
    ui.select("blocks.0.attn")
    ui.release_selected()
    assert ui.bar.status.value == (
        "release failed (ReleaseError): release_module refused: 1 tensor changed since materialization, and "
        "materializing again would not reproduce the change: parameter 'blocks.0.attn.weight': it was modified "
        f"in place (version counter {version} → {version + 1}: an optimizer step, `copy_`, `mul_`...). Save "
        "what you need first (state_dict), or pass force=True to release anyway and lose the change; nothing "
        "was released")
    assert "de-status-error" in ui.bar.status._dom_classes
    assert isinstance(ui.bar.error, explorer.ReleaseError)
    after = snapshot(ui.module)
    assert all(after[k] is before[k] for k in before)


def test_release_selected_with_nothing_selected_or_nothing_materialized_says_so(ui):
    ui.release_selected()
    assert ui.bar.status.value == "nothing selected: tick modules in the tree first"
    ui.select("blocks.0")
    ui.release_selected()
    assert ui.bar.status.value == "nothing to release in the selection: no materialized tensors"
    assert explorer.is_deferred(ui.module.blocks[0].attn)


# -- Save checkpoint… ---------------------------------------------------------------------------------
def test_save_checkpoint_click_writes_eager_values_and_leaves_the_module_deferred(net_pair, tmp_path):
    from safetensors.torch import load_file

    eager, deferred = net_pair
    ui = widgets.ExplorerWidget(deferred)
    before = snapshot(deferred)
    ui.bar.save_directory.value = str(tmp_path / "net")
    ui.bar.save_button.click()  # a background thread, as materializing
    ui.bar.join(30)
    # the 20 state-dict names, head.weight stored once with embed.weight (as save_pretrained does)
    assert ui.bar.status.value == f"saved 19 tensors (1.0 KiB) to {tmp_path / 'net'} as safetensors: 1 file"
    assert (ui.bar.done, ui.bar.total) == (19, 19) and ui.bar.progress.value == 19
    stored = load_file(tmp_path / "net" / "model.safetensors")
    expected = {name: tensor for name, tensor in eager.state_dict().items() if name != "head.weight"}
    assert sorted(stored) == sorted(expected)
    assert all(torch.equal(stored[name], tensor) for name, tensor in expected.items())
    after = snapshot(deferred)
    assert all(after[name] is tensor for name, tensor in before.items())  # still the fakes
    assert not ui.bar.running and not ui.bar.save_button.disabled


def test_save_checkpoint_as_dcp_can_be_cancelled_leaving_no_file(ui, tmp_path):
    def press_cancel(change):  # once the first tensor is written
        if change["new"] == 1:
            ui.cancel()

    ui.bar.observe(press_cancel, names="done")
    ui.bar.save_directory.value = str(tmp_path)
    ui.bar.save_format.value = "dcp"
    ui.bar.save(wait=True)
    assert ui.bar.status.value == f"cancelled: no partial file left in {tmp_path}"
    assert list(tmp_path.iterdir()) == [] and ui.bar.done == 1
    ui.bar.unobserve(press_cancel, names="done")
    ui.bar.save(wait=True)
    # DCP keeps every name, as dcp.save(model.state_dict()) does: 20 tensor files and .metadata
    assert ui.bar.status.value == f"saved 20 tensors (1.2 KiB) to {tmp_path} as dcp: 21 files"


def test_save_checkpoint_without_a_directory_says_so(ui):
    ui.bar.save_button.click()
    assert ui.bar.status.value == "type the directory to save the checkpoint into first"
    assert not ui.bar.running


def test_hub_bytes_fetched_show_with_their_rate_and_the_layer_turns_materialized(hub_ui, local_hub):
    host = local_hub.endpoint.removeprefix("http://")
    before = local_hub.bytes_served(".safetensors")
    hub_ui.select("model.layers.3")
    hub_ui.materialize_selected(wait=True)
    assert local_hub.bytes_served(".safetensors") - before == 25_694_208
    assert (hub_ui.bar.fetched_bytes, hub_ui.bar.fetch_bytes) == (25_694_208, 25_694_208)
    assert re.fullmatch(rf"fetched 24\.5 MiB / 24\.5 MiB from {re.escape(host)} at [\d.]+ [KMG]?i?B/s",
                        hub_ui.bar.fetch.value)
    assert state_of(hub_ui, "model.layers.3") == ("materialized", STATE_COLOURS["materialized"])
    assert state_of(hub_ui, "model.layers.4") == ("remote", STATE_COLOURS["remote"])


def test_cancel_stops_a_hub_fetch_between_requests_and_leaves_the_model_deferred(hub_ui, local_hub, monkeypatch):
    from explorer import hub_fetch

    monkeypatch.setattr(hub_fetch, "_PARALLEL", 1)
    reports = []
    report = hub_ui.bar._fetch_progress

    def cancel_at_first(progress):
        reports.append(progress.done_bytes)
        hub_ui.bar.cancel()
        report(progress)

    monkeypatch.setattr(hub_ui.bar, "_fetch_progress", cancel_at_first)
    before = local_hub.bytes_served(".safetensors")
    hub_ui.materialize_all(wait=True)
    assert hub_ui.bar.status.value == "cancelled: whole module left as it was"
    assert len(reports) == 1 and local_hub.bytes_served(".safetensors") - before == reports[0] < 271_091_712
    assert all(explorer.is_deferred(p) for p in hub_ui.module.parameters())
