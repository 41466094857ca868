"""Rich HTML display of Inspection, MemoryPlan, DryRun and CheckpointCheck: what a notebook shows for a cell's value."""

from __future__ import annotations

import torch
from torch import nn

import explorer


def model() -> nn.Module:
    return explorer.deferred_init(lambda: nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)))


def test_inspection_shows_the_summary_and_the_first_rows_of_each_table():
    html = explorer.inspect(model())._repr_html_()
    assert "Sequential: 108 parameters, 4 names (4 parameters, 0 buffers) on 4 storages, 432 B" in html
    assert "<h4>tensors (4)</h4>" in html and "<h4>modules (3)</h4>" in html and "<h4>ops (12)</h4>" in html
    assert "<td>0.weight</td>" in html and "<td>(8, 8)</td>" in html and "<td>aten.uniform_.default</td>" in html
    assert repr(explorer.inspect(model())).startswith("Sequential: 108 parameters")  # terminals keep text


def test_memory_plan_shows_a_bar_per_device():
    html = explorer.plan_devices(model(), {"cpu": "1KB"})._repr_html_()
    assert '<tr class="de-rich-device" data-device="cpu"><td>cpu</td><td>432 B of 1000 B</td>' in html
    assert 'style="width:69.1px"' in html and "43.2%" in html


def test_dry_run_shows_shapes_bytes_and_flops_per_module():
    html = explorer.dry_run(model(), (2, 8))._repr_html_()
    assert "<b>Sequential dry run</b>: 384 FLOPs, peak activations 96 B" in html
    assert "<td>[(2, 4)]</td>" in html and "<td>128</td>" in html


def test_the_module_tree_counts_each_storage_once_as_the_summary_does():
    from explorer.render.rich import module_html

    class Views(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.zeros(100, 100))
            self.register_buffer("rows", self.table.detach()[:50])  # views of the table's storage
            self.register_buffer("column", self.table.detach()[:, 0])

    holder = nn.Module()
    holder.add_module("views", explorer.deferred_init(Views))
    html = module_html(holder, "summary")
    assert "<b>views</b> Views · 39.1 KiB · fake" in html  # one storage of 40,000 bytes


def test_text_is_escaped():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("<b>x</b>", nn.Linear(2, 2))

    html = explorer.inspect(explorer.deferred_init(Odd))._repr_html_()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_checkpoint_check_shows_the_verdict_and_one_row_per_problem_escaped(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"0.weight": torch.zeros(8, 8, dtype=torch.float16), "<script>x</script>": torch.zeros(1)}, str(path))
    html = explorer.check_checkpoint(model(), path)._repr_html_()
    assert '<div class="de-rich de-rich-checkpoint-check" data-ok="false">' in html
    assert "<b>not ok</b>: 3 missing, 1 unexpected, 1 dtype difference (converted on load) — Sequential" in html
    assert "<td>&lt;script&gt;x&lt;/script&gt;</td>" in html and "<script>x" not in html
    cells = [cell.strip() for cell in html.split("<tbody>")[1].split("</tbody>")[0].split("</td>")][:-1]
    assert [cell.rpartition("<td>")[2] for cell in cells][-10:] == [
        "unexpected", "&lt;script&gt;x&lt;/script&gt;", "", "(1,) float32", "model.safetensors",
        "dtype", "0.weight", "float32", "float16", "model.safetensors"]
    assert "dtype differences are converted on load" in html
