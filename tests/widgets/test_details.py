"""The details pane (`widgets/details.py`): "materialize expert i" for 3-D tensors."""

from __future__ import annotations

import torch
from torch import nn

import explorer
from widgets.details import TensorDetails


class Experts(nn.Module):
    """Fused experts (5 × 6 × 7) initialised by one normal_, a 2-D router, a 3-D constant."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(7, 5)
        self.gate_up_proj = nn.Parameter(nn.init.normal_(torch.empty(5, 6, 7), std=0.02))
        self.register_buffer("scale", torch.ones(2, 3, 4))


def _pane(module: nn.Module, name: str) -> TensorDetails:
    inspection = explorer.inspect(module)
    pane = TensorDetails(module)
    pane.show(inspection.tensors, inspection.storages, name)
    return pane


def test_a_3d_parameter_offers_its_experts_and_materializes_one_alone() -> None:
    torch.manual_seed(4)
    eager = Experts()
    torch.manual_seed(4)
    module = explorer.deferred_init(Experts)
    pane = _pane(module, "gate_up_proj")
    experts = pane.experts
    assert experts.layout.display is None and (experts.index.min, experts.index.max) == (0, 4)
    assert experts.status.value == "expert 0: 168 B drawn alone (random fill)"
    experts.index.value = 3
    assert experts.status.value == "expert 3: 168 B drawn alone (random fill)"
    experts.button.click()
    assert torch.equal(experts.values, eager.gate_up_proj[3])
    first = ", ".join(f"{v:.4g}" for v in eager.gate_up_proj[3].reshape(-1)[:4].tolist())
    values = eager.gate_up_proj[3].detach()
    assert experts.status.value == (f"expert 3: float32[6, 7], mean {values.mean().item():.4g}, "
                                    f"std {values.std().item():.4g}, first [{first}, ...]")
    assert explorer.is_deferred(module.gate_up_proj)  # the parameter itself stays deferred


def test_a_3d_constant_buffer_is_a_constant_expert() -> None:
    pane = _pane(explorer.deferred_init(Experts), "scale")
    assert pane.experts.status.value == "expert 0: 48 B drawn alone (constant)"
    assert torch.equal(pane.experts.materialize(), torch.ones(3, 4))


def test_other_tensors_and_panes_without_a_module_offer_no_experts() -> None:
    module = explorer.deferred_init(Experts)
    assert _pane(module, "router.weight").experts.layout.display == "none"
    inspection = explorer.inspect(module)
    bare = TensorDetails()
    bare.show(inspection.tensors, inspection.storages, "gate_up_proj")
    assert bare.experts.layout.display == "none" and bare.experts.materialize() is None
