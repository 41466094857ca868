"""A constructor that fails under deferred_init: `widgets.explore` shows the failure in place."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import explorer
import widgets
from explorer import DeferredInitError
from widgets.failure_banner import banner_html


@torch.library.custom_op("explorer_widget_tests::no_fake_kernel", mutates_args=())
def no_fake_kernel(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("table", no_fake_kernel(self.proj.weight))  # FAILING LINE


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.stage = Stage()
        self.head = nn.Linear(4, 2)  # never reached


def test_explore_shows_what_was_built_and_the_failure_instead_of_raising():
    ui = widgets.explore(Model)
    assert isinstance(ui.error, DeferredInitError)
    assert [node["path"] for node in ui.tree.nodes] == ["", "embed"]  # `stage` was never assigned
    assert explorer.is_fake(ui.module.embed.weight)
    report = ui.failure
    assert report.op == "explorer_widget_tests.no_fake_kernel.default"
    assert report.module_chain == "Model.stage(Stage)"
    assert report.source.endswith(f"test_failure_banner.py:{_line_of('# FAILING LINE')} in __init__")
    assert report.code == 'self.register_buffer("table", no_fake_kernel(self.proj.weight))  # FAILING LINE'
    assert report.reason.startswith("RuntimeError: There was no fake impl registered for")
    assert "Traceback (most recent call last)" in report.traceback
    # the ops recorded before the failure are listed: embedding and stage.proj init
    assert "aten.normal_.default" in set(ui.inspection.ops["op"])
    assert ui.bar.selected_button.disabled and ui.bar.all_button.disabled
    assert ui.bar.materialize_all(wait=True) is None
    assert explorer.is_deferred(ui.module)


def test_the_banner_lists_the_fields_and_hides_the_traceback_until_asked():
    ui = widgets.explore(Model)
    banner = ui.children[0]
    text = banner.body.value
    assert "deferred_init failed: explorer_widget_tests.no_fake_kernel.default could not run" in text
    assert '<tr class="de-failure-field" data-field="module_chain"><th>building</th><td>Model.stage(Stage)</td></tr>' in text
    assert "no_fake_kernel(self.proj.weight))  # FAILING LINE" in text
    assert banner.traceback.layout.display == "none"
    banner.traceback_toggle.value = True
    assert banner.traceback.layout.display is None and banner.traceback_toggle.description == "hide traceback"
    assert "Traceback (most recent call last)" in banner.traceback.value


def test_an_exception_from_the_constructor_itself_is_shown_too():
    class Raises(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(2, 2)
            raise ValueError("config says no")

    ui = widgets.explore(Raises)
    assert isinstance(ui.error, ValueError)
    assert ui.failure.op == "" and ui.failure.reason == "ValueError: config says no"
    assert [node["path"] for node in ui.tree.nodes] == ["", "first"]
    assert "the constructor raised ValueError" in banner_html(ui.failure)


def test_deferred_init_still_raises_and_bad_arguments_to_explore_still_raise():
    with pytest.raises(DeferredInitError) as error:
        explorer.deferred_init(Model)
    assert type(error.value.partial_module) is Model
    with pytest.raises(TypeError, match="deferred_init expects a callable"):
        widgets.explore("Model")


def _line_of(marker: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)
