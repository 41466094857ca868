"""ModuleSelection: the "a parent selects its subtree" rule, on plain module paths."""

import pytest

from widgets.selection import ModuleSelection

PATHS = ["", "embed", "layers", "layers.1", "layers.1.attn", "layers.1.mlp", "layers.10", "layers.10.attn", "head"]


def test_checking_a_parent_checks_its_whole_subtree():
    selection = ModuleSelection(PATHS)
    assert selection.ordered(selection.toggled([], "layers.1", True)) == ["layers.1", "layers.1.attn", "layers.1.mlp"]


def test_checking_layers_1_does_not_reach_layers_10():
    selection = ModuleSelection(PATHS)
    assert "layers.10" not in selection.toggled([], "layers.1", True)


def test_unchecking_a_child_unchecks_it_and_its_ancestors_but_not_its_siblings():
    selection = ModuleSelection(PATHS)
    everything = selection.toggled([], "", True)
    after = selection.ordered(selection.toggled(everything, "layers.1.attn", False))
    assert after == ["embed", "layers.1.mlp", "layers.10", "layers.10.attn", "head"]


def test_partial_lists_unchecked_ancestors_of_checked_modules():
    selection = ModuleSelection(PATHS)
    assert selection.partial(["layers.10.attn"]) == ["", "layers", "layers.10"]


def test_roots_are_the_tops_of_selected_subtrees():
    selection = ModuleSelection(PATHS)
    checked = selection.toggled(selection.toggled([], "layers.1", True), "head", True)
    assert selection.roots(checked) == ["layers.1", "head"]


def test_focus_is_the_deepest_module_holding_every_selected_subtree():
    selection = ModuleSelection(PATHS)
    assert selection.focus(selection.subtree("layers.1.attn")) == "layers.1.attn"
    assert selection.focus(["layers.1.attn", "layers.1.mlp"]) == "layers.1"
    assert selection.focus(["layers.1", "layers.10"]) == "layers"  # component-wise, not "layers.1"
    assert selection.focus(["layers.1", "head"]) == ""
    assert selection.focus([]) is None


def test_unknown_path_is_refused_with_its_name():
    selection = ModuleSelection(PATHS)
    with pytest.raises(KeyError, match="no module at path 'layers.2'"):
        selection.toggled([], "layers.2", True)
