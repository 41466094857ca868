"""Tiny `diffusers` models, built from constructor arguments only (no hub access).

Each entry names a model class and keyword arguments small enough that eager construction takes
milliseconds: UNets (2D, conditional, 1D, ControlNet), autoencoders (KL, VQ, tiny), and the
transformer backbones of DiT, PixArt, SD3, Flux, Sana, Wan, CogVideoX, AuraFlow and friends.
Sizes follow diffusers' own test suites: 1-2 layers, 2 heads of 8-16, 32-64 channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class DiffusersModel:
    name: str  # the class name, used as the pytest id
    kwargs: dict[str, Any]

    def build(self) -> nn.Module:
        import diffusers

        return getattr(diffusers, self.name)(**self.kwargs)


_UNET_BLOCKS = dict(block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=32)

DIFFUSERS_MODELS: tuple[DiffusersModel, ...] = (
    DiffusersModel(
        "UNet2DModel",
        dict(
            sample_size=32, in_channels=3, out_channels=3, **_UNET_BLOCKS,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        ),
    ),
    DiffusersModel(
        "UNet2DConditionModel",
        dict(
            sample_size=32, in_channels=4, out_channels=4, cross_attention_dim=32, attention_head_dim=8,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), **_UNET_BLOCKS,
        ),
    ),
    DiffusersModel(
        "ControlNetModel",
        dict(
            in_channels=4, cross_attention_dim=32, attention_head_dim=8,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            conditioning_embedding_out_channels=(16, 32), **_UNET_BLOCKS,
        ),
    ),
    DiffusersModel(
        "UNet1DModel",
        dict(
            block_out_channels=(8, 8, 16, 16), in_channels=14, out_channels=14, time_embedding_type="positional",
            use_timestep_embedding=True, flip_sin_to_cos=False, freq_shift=1.0, out_block_type="OutConv1DBlock",
            mid_block_type="MidResTemporalBlock1D", down_block_types=("DownResnetBlock1D",) * 4,
            up_block_types=("UpResnetBlock1D",) * 3, act_fn="swish",
        ),
    ),
    DiffusersModel(
        "AutoencoderKL",
        dict(
            in_channels=3, out_channels=3, latent_channels=4, **_UNET_BLOCKS,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        ),
    ),
    DiffusersModel(
        "VQModel",
        dict(
            in_channels=3, out_channels=3, latent_channels=3, num_vq_embeddings=32, **_UNET_BLOCKS,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        ),
    ),
    DiffusersModel(
        "AutoencoderTiny",
        dict(
            encoder_block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
            num_encoder_blocks=(1, 1, 1, 1), num_decoder_blocks=(1, 1, 1, 1),
        ),
    ),
    DiffusersModel(
        "DiTTransformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2, sample_size=8, patch_size=2),
    ),
    DiffusersModel(
        "PixArtTransformer2DModel",
        dict(
            sample_size=8, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=2,
            in_channels=4, out_channels=8, cross_attention_dim=16, caption_channels=32,
        ),
    ),
    DiffusersModel(
        "SD3Transformer2DModel",
        dict(
            sample_size=32, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
            caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
        ),
    ),
    DiffusersModel(
        "FluxTransformer2DModel",
        dict(
            patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        ),
    ),
    DiffusersModel(
        "SanaTransformer2DModel",
        dict(
            patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=2,
            num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
            sample_size=32,
        ),
    ),
    DiffusersModel(
        "WanTransformer3DModel",
        dict(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        ),
    ),
    DiffusersModel(
        "CogVideoXTransformer3DModel",
        dict(
            num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
            text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
            temporal_compression_ratio=4, max_text_seq_length=8,
        ),
    ),
    DiffusersModel(
        "AuraFlowTransformer2DModel",
        dict(
            sample_size=32, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
            attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
            out_channels=4, pos_embed_max_size=256,
        ),
    ),
    DiffusersModel(
        "PriorTransformer",
        dict(num_attention_heads=2, attention_head_dim=4, num_layers=2, embedding_dim=8, num_embeddings=7, additional_embeddings=4),
    ),
    DiffusersModel(
        "UVit2DModel",
        dict(
            hidden_size=32, cond_embed_dim=32, micro_cond_encode_dim=2, micro_cond_embed_dim=10, encoder_hidden_size=32,
            vocab_size=32, codebook_size=32, in_channels=32, block_out_channels=32, num_res_blocks=1,
            block_num_heads=2, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        ),
    ),
)
