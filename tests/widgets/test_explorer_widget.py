"""ExplorerWidget / explore: building, wrapping any module, the summary line, the public names."""

import pytest
import torch
from torch import nn

import explorer
import widgets


def test_explore_builds_under_deferred_init_without_touching_the_rng():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    ui = widgets.explore(nn.Linear, 3, 2, bias=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert explorer.is_fake(ui.module.weight) and ui.module.in_features == 3 and ui.module.bias is None
    assert ui.summary.value == ("Linear: 6 parameters, 1 names (1 parameters, 0 buffers) on 1 storages, 24 B"
                                " — nothing selected: showing everything")


def test_summary_counts_the_selection(ui):
    ui.select("blocks.0")
    # blocks.0, attn, mlp, mlp.0, mlp.1, mlp.2, norm
    assert ui.summary.value.endswith(" — selected: 7 modules")


def test_wraps_an_eager_module():
    ui = widgets.ExplorerWidget(nn.Sequential(nn.Linear(2, 3)))
    assert [(n["path"], n["state"]) for n in ui.tree.nodes] == [("", "materialized"), ("0", "materialized")]
    assert [row[6] for row in ui.tensors_tab.table.rows] == ["real", "real"]
    assert ui.ops_tab.table.row_keys == [] and ui.ops_tab.table.caption == "0 rows"
    ui.select("0")
    ui.materialize_selected(wait=True)
    assert ui.bar.status.value == "nothing to materialize in the selection: no fake tensors left"


def test_wraps_a_partly_materialized_module():
    module = explorer.deferred_init(lambda: nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)))
    explorer.materialize_module(module[1])
    ui = widgets.ExplorerWidget(module)
    assert [(n["path"], n["state"]) for n in ui.tree.nodes] == [("", "partly"), ("0", "fake"), ("1", "materialized")]


def test_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="ExplorerWidget expects an nn.Module, got Tensor"):
        widgets.ExplorerWidget(torch.zeros(2))


def test_tabs_and_public_names():
    assert widgets.__all__ == ["CompareWidget", "ExplorerWidget", "MaterializationCancelled", "STATE_COLOURS", "compare",
                               "explore"]
    ui = widgets.explore(nn.Linear, 2, 2)
    assert [ui.tabs.get_title(i) for i in range(4)] == ["Tensors", "Ops", "Graph", "Memory"]
    assert "de-materialize-button" in ui.bar.selected_button._dom_classes
    assert "de-status" in ui.bar.status._dom_classes and "de-graph" in ui.graph_tab.view._dom_classes


def test_front_end_modules_are_shipped_beside_the_widgets():
    from widgets.graph import GraphView
    from widgets.table import DataTable
    from widgets.tree import ModuleTree

    for cls, name in ((GraphView, "graph.js"), (ModuleTree, "tree.js"), (DataTable, "table.js")):
        source = str(cls._esm)
        assert "export default" in source and "render" in source, name


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])


def test_a_refresh_after_surgery_follows_the_new_module_tree():
    torch.manual_seed(0)
    ui = widgets.explore(_Blocks)
    model = ui.module
    ui.select("blocks.2")
    ui.show_tensor("blocks.2.weight")
    with explorer.deferred(model):  # documented surgery: a head added, the last block dropped
        model.extra = nn.Linear(3, 4)
        del model.blocks[2]
    ui.refresh()
    assert [node["path"] for node in ui.tree.nodes] == ["", "blocks", "blocks.0", "blocks.1", "extra"]
    assert ui.selection == [] and ui.tensor is None  # the removed block is no longer checked or open
    ui.tree.select("extra")  # the new module can be chosen, and materialized
    ui.materialize_selected(wait=True)
    assert not explorer.is_deferred(model.extra) and explorer.is_deferred(model.blocks[0])
