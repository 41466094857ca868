"""timm parity: one model per timm family, deferred then materialized, equals eager bit for bit.

The sample is the smallest model (by parameter and buffer bytes, as `make zoo` measured them with
timm 1.0.31) of every timm module whose smallest model holds at most 50 MiB: 61 families,
about 1.2 GB in all. `make zoo` covers all 1,371 models; this is the part CI can afford.
torchvision imports through tests/support/torchvision_hook.py (armed by the venv's .pth file).
"""

from __future__ import annotations

import pytest
import torch

from explorer import deferred_init, inspect, is_deferred, materialize_module
from tests.support.parity import assert_module_equals_eager

timm = pytest.importorskip("timm")

SEED = 0
# (timm module, model name)
TIMM_SAMPLE: tuple[tuple[str, str], ...] = (
    ("byoanet", "halonet_h1"),
    ("byobnet", "test_byobnet"),
    ("cait", "cait_xxs24_224"),
    ("coat", "coat_tiny"),
    ("convit", "convit_tiny"),
    ("convnext", "test_convnext"),
    ("cpubone", "cpubone_nano"),
    ("crossvit", "crossvit_tiny_240"),
    ("csatv2", "csatv2"),
    ("cspnet", "cs3darknet_focus_s"),
    ("cspnext", "cspnext_tiny"),
    ("deit", "deit_tiny_patch16_224"),
    ("densenet", "densenet121"),
    ("dla", "dla46x_c"),
    ("dpn", "dpn48b"),
    ("edgenext", "edgenext_xx_small"),
    ("efficientformer", "efficientformer_l1"),
    ("efficientformer_v2", "efficientformerv2_s0"),
    ("efficientnet", "test_efficientnet_gn"),
    ("efficientvim", "efficientvim_m1"),
    ("efficientvit_mit", "efficientvit_b0"),
    ("efficientvit_msra", "efficientvit_m0"),
    ("eva", "vit_tiny_patch16_dinov3_qkvb"),
    ("fasternet", "fasternet_t0"),
    ("fastvit", "fastvit_t8"),
    ("gcvit", "gcvit_xxtiny"),
    ("ghostnet", "ghostnet_050"),
    ("hardcorenas", "hardcorenas_b"),
    ("hgnet", "hgnetv2_b0"),
    ("iformer", "iformer_t"),
    ("inception_next", "inception_next_atto"),
    ("lcnetv2", "lcnetv2_small"),
    ("levit", "levit_128s"),
    ("mambaout", "test_mambaout"),
    ("maxxvit", "test_coatnet"),
    ("metaformer", "poolformerv2_s12"),
    ("mlp_mixer", "gmlp_ti16_224"),
    ("mobilenetv3", "mobilenetv3_small_050"),
    ("mobilevit", "mobilevit_xxs"),
    ("nfnet", "test_nfnet"),
    ("pit", "pit_ti_224"),
    ("pvt_v2", "pvt_v2_b0"),
    ("regnet", "regnetx_002"),
    ("repghost", "repghostnet_050"),
    ("repvit", "repvit_m1"),
    ("resnest", "resnest14d"),
    ("resnet", "test_resnet"),
    ("resnetv2", "resnetv2_18"),
    ("rexnet", "rexnet_100"),
    ("senet", "legacy_seresnet18"),
    ("shvit", "shvit_s1"),
    ("sknet", "skresnet18"),
    ("starnet", "starnet_s050"),
    ("swiftformer", "swiftformer_xs"),
    ("tiny_vit", "tiny_vit_5m_224"),
    ("visformer", "visformer_tiny"),
    ("vision_transformer", "test_vit"),
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224"),
    ("vision_transformer_relpos", "test_vit_relpos"),
    ("vovnet", "ese_vovnet19b_slim_dw"),
    ("xcit", "xcit_nano_12_p8_224"),
)


def build(name: str) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False)


@pytest.mark.parametrize("family, name", TIMM_SAMPLE, ids=[name for _, name in TIMM_SAMPLE])
def test_timm_model_materializes_bitwise_equal_to_eager(family: str, name: str):
    torch.manual_seed(SEED)
    eager = build(name)
    torch.manual_seed(SEED)
    before = torch.get_rng_state()
    module = deferred_init(build, name)
    assert torch.equal(torch.get_rng_state(), before), "deferred_init advanced the global RNG"
    assert is_deferred(module)
    materialize_module(module)
    assert_module_equals_eager(f"{family}/{name}", module, eager)


def test_sample_spans_sixty_families():
    families = {family for family, _ in TIMM_SAMPLE}
    assert len(families) == len(TIMM_SAMPLE) >= 60
    assert set(timm.list_modules()) >= families


def test_regnet_constructor_calling_torch_unique_records_it_and_matches_eager():
    """timm's RegNet computes its stage widths with `torch.unique` on tensors it built: a
    data-dependent op, computed for real while recording, with its real output shape."""
    torch.manual_seed(SEED)
    eager = build("regnety_002")
    torch.manual_seed(SEED)
    module = deferred_init(build, "regnety_002")
    ops = inspect(module).ops
    unique = ops[ops["op"] == "aten._unique2.default"]
    assert len(unique) >= 1 and set(unique["kind"]) == {"compute"}
    assert unique.iloc[0]["output_shapes"][0] == (4,)  # four stages
    assert unique.iloc[0]["source"].split("/")[-1].startswith("regnet.py:")
    materialize_module(module)
    assert_module_equals_eager("regnety_002", module, eager)
