"""widgets.compare: two models' differences in modules and tensor metadata, as tables; a model against a
checkpoint path, as the checkpoint check."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
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
    with pytest.raises(TypeError, match="compare: after must be an nn.Module, an Inspection or .after. a checkpoint "
                                        "path, got int"):
        widgets.compare(nn.Linear(2, 2), 42)


def test_compare_with_a_checkpoint_path_shows_the_check(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"weight": torch.zeros(2, 3), "bias": torch.zeros(2, dtype=torch.float16)}, str(path))
    view = widgets.compare(explorer.deferred_init(nn.Linear, 3, 2), str(path))
    assert view.check.summary() == (f"ok: 1 dtype difference (converted on load) — Linear (2 keys) vs {path} "
                                    "(safetensors, 2 keys)")
    assert view.report.value == view.check._repr_html_()
    assert "de-compare-checkpoint" in view.report._dom_classes and "de-compare" in view._dom_classes


def test_compare_with_a_missing_checkpoint_path_names_it(tmp_path):
    with pytest.raises(explorer.CheckpointError, match="model: no such file or directory"):
        widgets.compare(nn.Linear(2, 2), tmp_path / "model")
    with pytest.raises(TypeError, match="compare: checking a checkpoint needs the module as before, got Inspection"):
        widgets.compare(explorer.inspect(nn.Linear(2, 2)), tmp_path / "model")


def test_compare_shows_labels_and_class_names_as_text_not_markup():
    evil_class = type("<b onmouseover=alert(2)>", (nn.Linear,), {})
    view = widgets.compare(nn.Linear(2, 2), evil_class(2, 2), labels=("<img src=x onerror=alert(1)>", "a & b"))
    assert view.summary.value == ("<b>&lt;img src=x onerror=alert(1)&gt;</b> (Linear) → <b>a &amp; b</b> "
                                  "(&lt;b onmouseover=alert(2)&gt;): 1 module changed class")
