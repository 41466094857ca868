"""`%load_ext widgets`: the %%deferred cell magic, %deferred_status and rich display, in an IPython shell."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import explorer
import widgets
from explorer.render.rich import tensor_html
from widgets.extension import assigned_names

ORIGINAL_MODULE_INIT = nn.Module.__init__


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext widgets", store_history=False)
    shell.run_cell("import torch\nfrom torch import nn", store_history=False)
    yield shell
    shell.run_cell("%unload_ext widgets", store_history=False)
    for name in ("before", "after", "a", "model", "noise", "b", "c"):
        shell.user_ns.pop(name, None)


def run(shell, cell: str):
    result = shell.run_cell(cell, store_history=False)
    return result


def test_the_magic_defers_exactly_what_the_cell_builds_and_shows_the_last_assigned(shell):
    run(shell, "before = nn.Linear(2, 2)")
    result = run(shell, "%%deferred\na = nn.Linear(4, 3)\nmodel = nn.Sequential(nn.Linear(3, 3), nn.ReLU())\n"
                        "noise = torch.randn(3)\nx = 1\n")
    run(shell, "after = nn.Linear(2, 2)")
    ns = shell.user_ns
    assert isinstance(result.result, widgets.ExplorerWidget) and result.result.module is ns["model"]
    assert explorer.is_deferred(ns["a"]) and explorer.is_deferred(ns["model"]) and explorer.is_fake(ns["noise"])
    assert not explorer.is_deferred(ns["before"]) and not explorer.is_deferred(ns["after"])
    assert nn.Module.__init__ is ORIGINAL_MODULE_INIT and not explorer.is_fake(torch.ones(1))
    named = run(shell, "%%deferred a\nb = nn.Linear(2, 2)\n")
    assert named.result.module is ns["a"]
    missing = run(shell, "%%deferred nothing_here\nc = nn.Linear(2, 2)\n")
    assert "%%deferred nothing_here: after the cell, 'nothing_here' is not defined, not an nn.Module" in str(
        missing.error_in_exec)


def test_a_failing_cell_is_shown_in_place_and_restores_everything(shell):
    state = torch.get_rng_state()
    result = run(shell, "%%deferred\nclass Broken(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                        "        self.ok = nn.Linear(2, 2)\n        raise ValueError('config says no')\nb = Broken()\n")
    ui = result.result
    assert result.error_in_exec is None and isinstance(ui, widgets.ExplorerWidget)
    assert isinstance(ui.error, ValueError) and ui.failure.reason == "ValueError: config says no"
    assert ui.failure.module_chain == "Broken" and [n["path"] for n in ui.tree.nodes] == ["", "ok"]
    assert ui.failure.code == "raise ValueError('config says no')"
    assert shell.user_ns["_deferred_error"] is ui.error
    assert torch.equal(torch.get_rng_state(), state) and nn.Module.__init__ is ORIGINAL_MODULE_INIT
    assert not explorer.is_fake(torch.ones(2)) and torch.ones(2).sum().item() == 2.0


def test_a_transformers_model_in_a_cell(shell):
    result = run(shell, "%%deferred\nimport transformers\nconfig = transformers.LlamaConfig(hidden_size=32, "
                        "intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, "
                        "vocab_size=50)\nmodel = transformers.LlamaForCausalLM(config)\n")
    model = shell.user_ns["model"]
    assert result.result.module is model and explorer.is_deferred(model)
    assert result.result.inspection.root_class == "LlamaForCausalLM"


def test_status_lists_the_deferred_modules_with_their_names_and_shares(shell):
    run(shell, "%%deferred\nmodel = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))\n")
    explorer.materialize_module(shell.user_ns["model"][1])
    table = run(shell, "%deferred_status").result
    row = table[table["names"] == "model"].iloc[0]
    assert (row["class"], row["parameters"], row["bytes"], row["materialized_bytes"], row["materialized"]) == (
        "Sequential", 30, 120, 40, "33.3%")


def test_a_cell_loading_a_checkpoint_is_deferred_and_listed_by_status(shell, tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    source = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    shell.user_ns["path"] = str(tmp_path / "w.safetensors")
    run(shell, "%%deferred\nfrom safetensors.torch import load_file\n"
               "model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))\nmodel.load_state_dict(load_file(path))\n")
    model = shell.user_ns["model"]
    assert explorer.is_deferred(model)
    assert explorer.inspect(model).tensors["state"].tolist() == ["disk"] * 4
    explorer.materialize_module(model[1])
    row = run(shell, "%deferred_status").result.set_index("names").loc["model"]
    assert (row["bytes"], row["materialized_bytes"], row["materialized"]) == (120, 40, "33.3%")
    assert torch.equal(model[1].weight, source[1].weight)
    shell.user_ns.pop("path")


def test_rich_display_of_deferred_modules_and_fake_tensors_only(shell):
    run(shell, "%%deferred\nmodel = nn.Sequential(nn.Linear(4, 4), nn.ReLU())\n")
    model = shell.user_ns["model"]
    html = shell.display_formatter.format(model)[0]["text/html"]
    assert "Sequential: 20 parameters, 2 names (2 parameters, 0 buffers) on 2 storages, 80 B" in html
    assert '<span class="de-rich-module" data-path="0"><b>0</b> Linear · 80 B · fake</span>' in html
    tensor = shell.display_formatter.format(model[0].weight)[0]["text/html"]
    assert '<tr data-field="stride"><th>stride</th><td>(4, 1)</td></tr>' in tensor
    assert '<tr data-field="state"><th>state</th><td>fake (no storage)</td></tr>' in tensor
    assert "text/html" not in shell.display_formatter.format(nn.Linear(2, 2))[0]  # eager: torch's repr
    assert "text/html" not in shell.display_formatter.format(torch.ones(2))[0]
    assert "real (materialized or eager)" in tensor_html(torch.ones(2))


def test_assigned_names_reads_the_cells_assignments_in_order():
    assert assigned_names("a = 1\nb, (c, d) = x\ne: int = 3\nf += 1\ng.h = 2\nprint(i)") == ["a", "b", "c", "d", "e", "f"]
    assert assigned_names("def broken(:") == []


def test_the_magics_without_a_shell_say_how_to_load_them():
    from widgets.extension import DeferredMagics

    with pytest.raises(UsageError, match="^the deferred magics are used without an IPython shell: load them with "
                                         "%load_ext widgets$"):
        DeferredMagics(shell=None).deferred("", "x = 1")
