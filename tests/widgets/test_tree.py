"""ModuleTree: what each node shows, and how front-end intents change the selection."""

from widgets.states import STATE_COLOURS


def node(ui, path):
    return next(n for n in ui.tree.nodes if n["path"] == path)


def test_nodes_show_class_params_bytes_device_and_state(ui):
    assert node(ui, "") == {"path": "", "label": "Net", "class": "Net", "depth": 0, "params": "248",
                            "bytes": "1.0 KiB", "device": "cpu", "state": "fake",
                            "colour": STATE_COLOURS["fake"], "has_children": True}
    assert node(ui, "blocks.0.mlp.0") == {"path": "blocks.0.mlp.0", "label": "0", "class": "Linear", "depth": 4,
                                          "params": "40", "bytes": "160 B", "device": "cpu", "state": "fake",
                                          "colour": STATE_COLOURS["fake"], "has_children": False}
    relu = node(ui, "blocks.0.mlp.1")
    assert (relu["class"], relu["params"], relu["bytes"], relu["state"]) == ("ReLU", "0", "0 B", "empty")


def test_tree_opens_with_the_root_and_its_containers_expanded(ui):
    assert ui.tree.expanded == ["", "blocks"]


def test_checkbox_message_checks_the_subtree_and_marks_ancestors_partial(ui):
    ui.tree._on_front_end_msg(ui.tree, {"type": "check", "path": "blocks.0.mlp", "checked": True}, [])
    assert ui.tree.checked == ["blocks.0.mlp", "blocks.0.mlp.0", "blocks.0.mlp.1", "blocks.0.mlp.2"]
    assert ui.tree.partial == ["", "blocks", "blocks.0"]


def test_unchecking_a_checkbox_inside_a_checked_parent(ui):
    ui.tree.set_checked("blocks", True)
    ui.tree._on_front_end_msg(ui.tree, {"type": "check", "path": "blocks.1.mlp", "checked": False}, [])
    assert ui.tree.checked == ["blocks.0", "blocks.0.attn", "blocks.0.mlp", "blocks.0.mlp.0", "blocks.0.mlp.1",
                               "blocks.0.mlp.2", "blocks.0.norm", "blocks.1.attn", "blocks.1.norm"]
    assert ui.tree.partial == ["", "blocks", "blocks.1"]


def test_label_click_selects_only_that_subtree_and_unfolds_down_to_it(ui):
    ui.tree.set_checked("embed", True)
    ui.tree._on_front_end_msg(ui.tree, {"type": "select", "path": "blocks.1.mlp"}, [])
    assert ui.tree.checked == ["blocks.1.mlp", "blocks.1.mlp.0", "blocks.1.mlp.1", "blocks.1.mlp.2"]
    assert ui.tree.active == "blocks.1.mlp"
    assert ui.tree.expanded == ["", "blocks", "blocks.1"]
    assert ui.selection == ui.tree.checked


def test_a_module_read_from_a_checkpoint_is_disk_until_materialized(disk_ui):
    layer = node(disk_ui, "model.layers.0")
    assert (layer["state"], layer["colour"]) == ("disk", STATE_COLOURS["disk"])
    disk_ui.select("model.layers.0")
    disk_ui.materialize_selected(wait=True)
    assert [node(disk_ui, path)["state"] for path in ("model.layers.0", "model.layers.1", "")] == [
        "materialized", "disk", "partly"]


def test_every_synced_trait_says_what_it_is():
    from widgets.tree import ModuleTree

    helps = {name: trait.help for name, trait in ModuleTree.class_own_traits(sync=True).items()}
    assert sorted(helps) == ["active", "aliases", "checked", "colours", "expanded", "matches", "nodes", "partial"]
    assert [name for name, text in helps.items() if not text] == []
    assert helps["checked"] == ("Checked module paths, tree order, closed under 'a parent selects its subtree'; "
                                "set by Python only")
