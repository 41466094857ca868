"""Tensors tab: rows follow the tree selection, filters and sorting, the details pane."""

from pathlib import Path

from widgets.states import STATE_COLOURS

CONFTEST = Path(__file__).with_name("conftest.py")


def keys(ui):
    return ui.tensors_tab.table.row_keys


def test_nothing_selected_shows_every_tensor(ui):
    assert len(keys(ui)) == 20
    assert ui.tensors_tab.table.caption == "20 rows"


def test_rows_follow_the_tree_selection(ui):
    ui.select("blocks.1.mlp")
    assert keys(ui) == ["blocks.1.mlp.0.weight", "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight", "blocks.1.mlp.2.bias"]
    ui.tree.set_checked("head", True)
    assert keys(ui)[-1] == "head.weight" and len(keys(ui)) == 5
    ui.tree.clear()
    assert len(keys(ui)) == 20


def test_unchecking_a_child_drops_its_ancestors_own_tensors(ui):
    ui.tree.set_checked("", True)
    assert len(keys(ui)) == 20
    # the root is no longer wholly selected, so its own buffers leave with it
    ui.tree.set_checked("blocks", False)
    assert keys(ui) == ["embed.weight", "head.weight"]


def test_cells_are_formatted_and_coloured_by_state(ui):
    ui.select("embed")
    table = ui.tensors_tab.table
    assert table.columns == ["name", "shape", "stride", "storage_offset", "dtype", "device", "state", "alias_group",
                             "bytes"]
    assert table.labels == ["", "", "", "offset", "", "", "", "alias/tie group", ""]
    assert table.rows == [
        ["embed.weight", "(10, 4)", "(4, 1)", "0", "float32", "cpu", "fake", "head.weight", "160 B"]]
    assert table.row_colours == [STATE_COLOURS["fake"]]


def test_the_column_chooser_adds_and_removes_columns(ui):
    ui.select("embed")
    chooser = ui.tensors_tab.columns
    assert "closure_ops" in chooser.allowed_tags and "producer" in chooser.allowed_tags
    chooser.value = ["name", "kind", "closure_ops", "producer"]
    table = ui.tensors_tab.table
    assert table.columns == ["name", "kind", "closure_ops", "producer"]
    assert table.rows == [["embed.weight", "parameter", "3", "aten.detach.default"]]


def test_name_filter_is_a_case_insensitive_substring(ui):
    ui.select("blocks.0")
    ui.tensors_tab.name_filter.value = "ATTN"
    assert keys(ui) == ["blocks.0.attn.weight", "blocks.0.attn.bias"]


def test_dtype_filter_offers_the_dtypes_present(ui):
    assert ui.tensors_tab.dtype_filter.options == ("all", "float32", "int64")
    ui.tensors_tab.dtype_filter.value = "int64"
    assert keys(ui) == ["positions", "window"]


def test_device_and_state_filters(ui):
    ui.tensors_tab.device_filter.value = "cpu"
    assert len(keys(ui)) == 20
    ui.select("blocks.0.norm")
    ui.materialize_selected(wait=True)
    ui.tree.clear()
    ui.tensors_tab.state_filter.value = "materialized"
    assert keys(ui) == ["blocks.0.norm.weight", "blocks.0.norm.bias"]
    assert ui.tensors_tab.state_filter.options == ("all", "fake", "materialized")


def test_a_filter_keeps_its_place_in_the_browser_when_a_materialization_adds_options(ui):
    state = ui.tensors_tab.state_filter
    state.set_state({"index": list(state.options).index("fake")})  # what the browser sends when one picks "fake"
    ui.select("blocks.0.norm")
    ui.materialize_selected(wait=True)  # "materialized" joins the options
    ui.tree.clear()
    assert state.options == ("all", "fake", "materialized")
    assert state.options[state.get_state()["index"]] == state.value == "fake"  # the browser shows what filters
    state.value = "materialized"  # set from Python: the browser follows
    assert state.get_state()["index"] == 2 and keys(ui) == ["blocks.0.norm.weight", "blocks.0.norm.bias"]


def test_header_sort_orders_by_the_raw_values(ui):
    ui.select("blocks.0")
    ui.tensors_tab.table.sort_by = "bytes"  # what clicking the header sends
    ui.tensors_tab.table.ascending = False
    assert [row[8] for row in ui.tensors_tab.table.rows] == ["128 B", "128 B", "64 B", "32 B", "16 B", "16 B",
                                                              "16 B", "16 B"]
    assert keys(ui)[:2] == ["blocks.0.mlp.0.weight", "blocks.0.mlp.2.weight"]  # stable among equals


def test_sorting_by_shape_tuples(ui):
    ui.select("blocks.0.mlp")
    ui.tensors_tab.table.sort_by = "shape"
    assert [row[1] for row in ui.tensors_tab.table.rows] == ["(4,)", "(4, 8)", "(8,)", "(8, 4)"]


def test_row_click_opens_details_with_the_fake_tensors_metadata(ui, net_pair):
    eager, _ = net_pair
    ui.tensors_tab.table.selected = "window"  # what clicking the row sends
    window_line = next(i for i, line in enumerate(CONFTEST.read_text().splitlines(), 1) if "WINDOW LINE" in line)
    assert ui.details.layout.display is None
    assert ui.details.title.value == "window"
    assert ui.details.values == {
        "name": "window", "module": "", "kind": "buffer", "state": "fake", "shape": "(2,)", "stride": "(1,)",
        "storage offset": "1", "dtype": "int64", "device": "cpu", "numel": "2", "bytes": "16 B",
        "storage size": "32 B", "storage id": "0", "contiguous": "yes", "view": "yes", "requires grad": "no",
        "alias group": "positions", "tied names": "none", "producer": "aten.slice.Tensor",
        "last write": "aten.arange.default", "closure ops": "2", "source": f"{CONFTEST}:{window_line} in __init__",
    }
    # the same layout eager construction gives
    window = eager.window
    assert (window.storage_offset(), window.stride(), window.untyped_storage().nbytes()) == (1, (1,), 32)
    assert ui.details.table.rows[6] == ["storage offset", "1"]


def test_details_of_a_tied_weight_name_the_other_name(ui):
    ui.show_tensor("head.weight")
    assert (ui.details.values["tied names"], ui.details.values["alias group"]) == ("embed.weight", "embed.weight")
    assert ui.details.values["storage size"] == "160 B"
    assert ui.details.values["last write"] == "aten.normal_.default"
    assert ui.tensors_tab.table.selected == "head.weight"


def test_the_column_chooser_offers_the_checkpoint_provenance_columns(disk_ui):
    chooser = disk_ui.tensors_tab.columns
    assert {"file", "key", "offset", "disk_dtype"} <= set(chooser.allowed_tags)
    assert not {"file", "key", "offset", "disk_dtype"} & set(chooser.value)  # optional: not shown at first


def test_24_layer_names_shortened_to_a_narrow_column_are_distinct_and_keep_their_index():
    import transformers

    import widgets
    from explorer.naming import short_path
    from tests.support.hf_configs import _DECODER

    config = transformers.Qwen2Config(**{**_DECODER, "num_hidden_layers": 24}, tie_word_embeddings=True)
    table = widgets.explore(transformers.Qwen2ForCausalLM, config).tensors_tab.table
    assert table.path_columns == ["name", "alias_group"]  # alias lists are names too
    names = [row[0] for row in table.rows if row[0].endswith("q_proj.weight")]
    assert names == [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(24)]  # full: the titles
    # what table.js draws in an 18-character name cell (short_path.js passes the same spec)
    shorts = [short_path(name, 18) for name in names]
    assert shorts[7] == "…7.…q_proj.weight" and shorts[17] == "…17.…q_proj.weight"
    assert len(set(shorts)) == 24
    assert all(short.startswith(f"…{i}.") for i, short in enumerate(shorts))


def test_the_tensors_table_groups_rows_by_module_when_asked_until_sorted_by_another_column(ui):
    table = ui.tensors_tab.table
    assert table.row_groups == []  # off at first: each row shows its whole (cut) name
    ui.tensors_tab.group_toggle.value = True
    assert table.row_keys[:11] == [
        "positions", "window", "embed.weight", "blocks.0.attn.weight", "blocks.0.attn.bias", "blocks.0.mlp.0.weight",
        "blocks.0.mlp.0.bias", "blocks.0.mlp.2.weight", "blocks.0.mlp.2.bias", "blocks.0.norm.weight",
        "blocks.0.norm.bias",
    ]  # fmt: skip
    assert table.row_groups[:3] == [  # the root's buffers and embed.weight stand alone
        {"prefix": "blocks.0", "start": 3, "stop": 5},
        {"prefix": "blocks.0.mlp", "start": 5, "stop": 9},
        {"prefix": "blocks.0", "start": 9, "stop": 11},
    ]
    assert len(table.row_groups) == 6
    table.sort_by = "bytes"
    assert table.row_groups == []


def test_hub_weights_show_remote_with_their_repo_commit_file_key_and_offset(hub_ui):
    from tests.support.hub_server import LLAMA_REPO

    hub_ui.select("model.layers.3.mlp.up_proj")
    table = hub_ui.tensors_tab.table
    assert keys(hub_ui) == ["model.layers.3.mlp.up_proj.weight"]
    assert table.row_colours == [STATE_COLOURS["remote"]]
    assert table.rows[0][table.columns.index("state")] == "remote"
    assert next(n["colour"] for n in hub_ui.tree.nodes if n["path"] == "model.layers.3") == STATE_COLOURS["remote"]
    hub_ui.show_tensor("model.layers.3.mlp.up_proj.weight")
    details = hub_ui.details.values
    commit = hub_ui.inspection.reads["file"].iloc[0].split("@")[1].split("/")[0]
    assert {field: details[field] for field in ("state", "hub repo", "hub commit", "file in repo", "key")} == {
        "state": "remote", "hub repo": LLAMA_REPO, "hub commit": commit,
        "file in repo": "model-00002-of-00003.safetensors", "key": "model.layers.3.mlp.up_proj.weight"}
    offsets = hub_ui.inspection.reads.set_index("key")["offset"]
    assert details["file offset"] == f"{offsets['model.layers.3.mlp.up_proj.weight']:,}" and len(commit) == 12
