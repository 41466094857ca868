"""Tiny Hugging Face transformers architectures, built from config objects only (no hub access).

Each entry of `HF_ARCHITECTURES` names a model class, the kind of architecture it stands for, a
config small enough that eager construction takes milliseconds, and a tiny example input for a
forward pass. Tests, benchmarks and notebooks share this table:

    from tests.support.hf_configs import HF_ARCHITECTURES, build_eager
    for arch in HF_ARCHITECTURES:
        model = build_eager(arch)            # arch.cls(arch.config())
        out = model.eval()(**arch.inputs())

Sizes: hidden 16-32, 2 layers (or 2 stages), vocab 96, images 32x32. `drop_path_rate` is non-zero
where a model has stochastic depth, so its `torch.linspace(...).item()/.tolist()` schedule read
inside the constructor carries real values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import transformers
from torch import nn

VOCAB = 96
SEQ = 8
IMAGE = 32

# Shared sizes for the decoder-only transformers (Llama family).
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@dataclass(frozen=True)
class HFArchitecture:
    name: str  # short id, used as the pytest id
    kind: str  # decoder-only, encoder, encoder-decoder, vision, MoE, state-space
    cls: type[nn.Module]
    config: Callable[[], Any]  # a fresh tiny config object
    inputs: Callable[[], dict[str, torch.Tensor]]  # a fresh tiny forward input

    @property
    def class_name(self) -> str:
        return self.cls.__name__


def _tokens(batch: int = 2, seq: int = SEQ, offset: int = 3) -> torch.Tensor:
    # deterministic, no RNG involved; ids stay clear of the special ids 0-2
    return (torch.arange(batch * seq).reshape(batch, seq) * 7 + offset) % (VOCAB - offset) + offset


def _text() -> dict[str, torch.Tensor]:
    return {"input_ids": _tokens()}


def _text_masked() -> dict[str, torch.Tensor]:
    ids = _tokens()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _seq2seq() -> dict[str, torch.Tensor]:
    return {"input_ids": _tokens(), "decoder_input_ids": _tokens(seq=5, offset=4)}


def _image() -> dict[str, torch.Tensor]:
    pixels = torch.linspace(-1.0, 1.0, 2 * 3 * IMAGE * IMAGE).reshape(2, 3, IMAGE, IMAGE)
    return {"pixel_values": pixels.sin()}


T = transformers

HF_ARCHITECTURES: list[HFArchitecture] = [
    # --- decoder-only -------------------------------------------------------------------------
    HFArchitecture("llama", "decoder-only", T.LlamaForCausalLM,
                   lambda: T.LlamaConfig(**_DECODER), _text),
    HFArchitecture("mistral", "decoder-only", T.MistralForCausalLM,
                   lambda: T.MistralConfig(**_DECODER, sliding_window=4), _text),
    HFArchitecture("qwen2", "decoder-only", T.Qwen2ForCausalLM,
                   lambda: T.Qwen2Config(**_DECODER, tie_word_embeddings=True), _text),
    HFArchitecture("gpt2", "decoder-only", T.GPT2LMHeadModel,
                   lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                       bos_token_id=1, eos_token_id=2),
                   _text),
    HFArchitecture("gpt_neox", "decoder-only", T.GPTNeoXForCausalLM,
                   lambda: T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           max_position_embeddings=64, rotary_pct=0.5),
                   _text),
    HFArchitecture("phi", "decoder-only", T.PhiForCausalLM,
                   lambda: T.PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       max_position_embeddings=64, partial_rotary_factor=0.5),
                   _text),
    HFArchitecture("gemma", "decoder-only", T.GemmaForCausalLM,
                   lambda: T.GemmaConfig(**{**_DECODER, "num_key_value_heads": 1}, head_dim=8), _text),
    HFArchitecture("gemma2", "decoder-only", T.Gemma2ForCausalLM,
                   lambda: T.Gemma2Config(**_DECODER, head_dim=8, sliding_window=4), _text),
    HFArchitecture("opt", "decoder-only", T.OPTForCausalLM,
                   lambda: T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=64,
                                       word_embed_proj_dim=32),
                   _text_masked),
    # --- encoder ------------------------------------------------------------------------------
    HFArchitecture("bert", "encoder", T.BertForMaskedLM,
                   lambda: T.BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        max_position_embeddings=64),
                   _text_masked),
    HFArchitecture("roberta", "encoder", T.RobertaForMaskedLM,
                   lambda: T.RobertaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           max_position_embeddings=66, pad_token_id=1),
                   _text_masked),
    HFArchitecture("distilbert", "encoder", T.DistilBertForMaskedLM,
                   lambda: T.DistilBertConfig(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                              max_position_embeddings=64, sinusoidal_pos_embds=True),
                   _text_masked),
    # --- encoder-decoder ----------------------------------------------------------------------
    HFArchitecture("t5", "encoder-decoder", T.T5ForConditionalGeneration,
                   lambda: T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                      num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                      decoder_start_token_id=0),
                   _seq2seq),
    HFArchitecture("bart", "encoder-decoder", T.BartForConditionalGeneration,
                   lambda: T.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64),
                   _seq2seq),
    # --- vision -------------------------------------------------------------------------------
    HFArchitecture("vit", "vision", T.ViTForImageClassification,
                   lambda: T.ViTConfig(image_size=IMAGE, patch_size=8, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4, num_labels=10),
                   _image),
    HFArchitecture("swin", "vision (windowed attention, drop path)", T.SwinForImageClassification,
                   lambda: T.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                                        num_heads=[2, 2], window_size=4, drop_path_rate=0.1, num_labels=10),
                   _image),
    HFArchitecture("swinv2", "vision (drop-path schedule via linspace().item())", T.Swinv2ForImageClassification,
                   lambda: T.Swinv2Config(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                                          num_heads=[2, 2], window_size=4, drop_path_rate=0.1, num_labels=10),
                   _image),
    HFArchitecture("convnext", "vision (drop-path schedule via linspace().split().tolist())",
                   T.ConvNextForImageClassification,
                   lambda: T.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], drop_path_rate=0.1,
                                            image_size=IMAGE, num_labels=10),
                   _image),
    HFArchitecture("dinov2", "vision (layer scale, drop path)", T.Dinov2Model,
                   lambda: T.Dinov2Config(image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, mlp_ratio=2, drop_path_rate=0.1),
                   _image),
    # --- mixture of experts -------------------------------------------------------------------
    HFArchitecture("mixtral", "MoE", T.MixtralForCausalLM,
                   lambda: T.MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2), _text),
    HFArchitecture("qwen2_moe", "MoE (shared expert)", T.Qwen2MoeForCausalLM,
                   lambda: T.Qwen2MoeConfig(**_DECODER, num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                            decoder_sparse_step=1),
                   _text),
    HFArchitecture("olmoe", "MoE", T.OlmoeForCausalLM,
                   lambda: T.OlmoeConfig(**_DECODER, num_experts=4, num_experts_per_tok=2,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2), _text),
    # --- state-space / recurrent --------------------------------------------------------------
    HFArchitecture("mamba", "state-space", T.MambaForCausalLM,
                   lambda: T.MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
                                         expand=2, conv_kernel=4, use_cache=False),
                   _text),
    HFArchitecture("falcon_mamba", "state-space", T.FalconMambaForCausalLM,
                   lambda: T.FalconMambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                               num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False),
                   _text),
    HFArchitecture("rwkv", "recurrent (RWKV)", T.RwkvForCausalLM,
                   lambda: T.RwkvConfig(vocab_size=VOCAB, context_length=64, hidden_size=32,
                                        attention_hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        use_cache=False),
                   _text),
]

HF_BY_NAME: dict[str, HFArchitecture] = {arch.name: arch for arch in HF_ARCHITECTURES}


def config_with_layers(arch: HFArchitecture, layers: int) -> Any:
    """`arch.config()` with `layers` decoder layers (per-layer lists such as `layer_types` follow)."""
    config = arch.config()
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * layers
    return config


def build_eager(arch: HFArchitecture, seed: int = 0) -> nn.Module:
    """`arch.cls(arch.config())` from `torch.manual_seed(seed)`."""
    config = arch.config()
    torch.manual_seed(seed)
    return arch.cls(config)


def architecture_table() -> str:
    """The table as Markdown, for the README."""
    rows = ["| name | kind | class |", "| --- | --- | --- |"]
    rows += [f"| {a.name} | {a.kind} | `transformers.{a.class_name}` |" for a in HF_ARCHITECTURES]
    return "\n".join(rows)
