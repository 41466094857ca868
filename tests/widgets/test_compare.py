"""widgets.compare: two models' differences in modules and tensor metadata, as tables."""

from __future__ import annotations

import pytest
from torch import nn

import explorer
import widgets
from tests.explorer.inspection.test_diff import Base, Refactor


def test_compare_shows_the_summary_and_the_three_tables():
    view = widgets.compare(explorer.deferred_init(Base), explorer.inspect(explorer.deferred_init(Refactor)),
                           labels=("HF", "refactor"))
    assert view.summary.value == ("<b>HF</b> (Base) → <b>refactor</b> (Refactor): 1 module added; 2 modules changed "
                                  "class; 2 tensors added; 1 tensor removed; 4 tensors changed (dtype, shape, tied_with)")
    assert view.modules_table.rows == [["extra", "added", "", "Linear"], ["(root)", "class", "Base", "Refactor"],
                                       ["block.1", "class", "LayerNorm", "RMSNorm"]]
    assert view.tensors_table.rows[0] == ["block.1.bias", "removed", "parameter", "(4,)", "float32"]
    assert view.changes_table.rows[2] == ["block.0.weight", "dtype", "float32", "float16"]


def test_compare_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match="compare: after must be an nn.Module or an Inspection, got str"):
        widgets.compare(nn.Linear(2, 2), "model")
