"""A model split into pipeline stages, as torchtitan splits Llama (`pipeline_llama_manual_split`).

The repeated blocks (`fake_fsdp.repeated_blocks`) are divided evenly over the stages, in order; the
first stage also holds what runs before the blocks (the token embedding), the last what runs after
(the final norm and the head; the loss is the schedule's, computed on the last stage's output).

torchtitan deep-copies its model per stage, deletes the layers a stage does not own and sets
`tok_embeddings`/`norm`/`output` to None, its forward skipping what is None. A Hugging Face
`LlamaModel.forward` does not tolerate a missing `embed_tokens`, so a stage here is a module of its
own, `DecoderStage`, holding the pieces it owns (the original module objects, not copies) and
running them as the model's forward does: embed → rotary position embeddings and attention masks
(computed per stage, as each torchtitan stage does) → its layers → norm → head. Its blocks keep
their index in the model (`layers.6`), as torchtitan's `ModuleDict` of layers does.

Limitations: only decoder-only transformers laid out as Llama is (`model.embed_tokens`,
`model.layers`, `model.norm`, `model.rotary_emb`, `lm_head`), with one input (token ids) and no
padding mask; what a model's own forward does beyond that (Gemma 2's logit soft-capping) is not run.
Other models raise PipelineSplitError naming what is missing.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

__all__ = ["DecoderStage", "PipelineSplitError", "StagePlan", "plan_stages", "split_stages"]

_DECODER_PARTS = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")
# A `DecoderStage`'s own attribute → the path of the model's piece it holds.
_MODEL_PATH_OF = {part.rpartition(".")[2]: part for part in _DECODER_PARTS}


class PipelineSplitError(ValueError):
    """A model that cannot be split into the stages asked for (names the model and what is missing)."""


@dataclass(frozen=True)
class StagePlan:
    """Stage `index` of `stages`: the repeated blocks it runs (their paths in the model), whether it
    holds the embedding (the first stage) and the head (the last)."""

    index: int
    stages: int
    blocks: tuple[str, ...]
    embedding: bool
    head: bool


def _decoder_parts(model: nn.Module) -> dict[str, nn.Module]:
    """The Llama-layout pieces of `model`; PipelineSplitError naming the first one missing."""
    parts: dict[str, nn.Module] = {}
    for path in _DECODER_PARTS:
        try:
            parts[path] = model.get_submodule(path)
        except AttributeError:
            raise PipelineSplitError(
                f"no pipeline split for {type(model).__name__}: it has no `{path}` (a stage split is known for "
                "decoder-only transformers laid out as Llama: model.embed_tokens, model.layers, model.norm, "
                "model.rotary_emb, lm_head)"
            ) from None
    if not isinstance(parts["model.layers"], nn.ModuleList) or len(parts["model.layers"]) == 0:
        raise PipelineSplitError(
            f"no pipeline split for {type(model).__name__}: `model.layers` is not a non-empty ModuleList of blocks"
        )
    return parts


def _missing_mask_builder() -> str:
    """Why transformers' mask functions cannot be imported here ("" when they can)."""
    if importlib.util.find_spec("transformers") is None:
        return "needs transformers, which is not installed"
    if importlib.util.find_spec("transformers.masking_utils") is None:
        import transformers

        return f"transformers {transformers.__version__} does not have"
    return ""


def plan_stages(model: nn.Module, stages: int) -> list[StagePlan]:
    """Which blocks each of `stages` stages runs: `model.layers` divided evenly, in order.

    Raises PipelineSplitError for a model without the Llama layout, and for blocks not divisible
    by the stages (naming both counts)."""
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive int, got {stages!r}")
    layers = cast(nn.ModuleList, _decoder_parts(model)["model.layers"])
    if len(layers) % stages:
        raise PipelineSplitError(
            f"{type(model).__name__} has {len(layers)} blocks (model.layers), not divisible into {stages} "
            "pipeline stages: choose a stage count that divides it"
        )
    per_stage = len(layers) // stages
    return [
        StagePlan(
            index=index,
            stages=stages,
            blocks=tuple(f"model.layers.{i}" for i in range(index * per_stage, (index + 1) * per_stage)),
            embedding=index == 0,
            head=index == stages - 1,
        )
        for index in range(stages)
    ]


class DecoderStage(nn.Module):
    """One pipeline stage of a Llama-layout causal LM: the pieces it owns, run as the model's forward
    runs them. Takes token ids (first stage) or hidden states; returns hidden states, or logits
    (last stage). Unowned pieces are None, as in torchtitan's split."""

    def __init__(self, model: nn.Module, plan: StagePlan) -> None:
        super().__init__()
        parts = _decoder_parts(model)
        missing = _missing_mask_builder()
        if missing:
            raise PipelineSplitError(
                f"no pipeline split for {type(model).__name__}: stages build their attention masks with "
                f"transformers.masking_utils, which {missing} (the Llama-layout models of releases before it "
                "build masks inside the model's forward); upgrade transformers, or plan layouts without "
                "pipeline stages (pp=1)"
            )
        self.config = model.config
        self.plan = plan
        self.embed_tokens = parts["model.embed_tokens"] if plan.embedding else None
        layers = cast(nn.ModuleList, parts["model.layers"])
        indices = [path.rpartition(".")[2] for path in plan.blocks]
        self.layers = nn.ModuleDict({index: layers[int(index)] for index in indices})
        self.norm = parts["model.norm"] if plan.head else None
        self.lm_head = parts["lm_head"] if plan.head else None
        # Every stage computes its own rotary embeddings: its own copy of the (small) buffers, as
        # each of torchtitan's per-stage model copies holds its own.
        self.rotary_emb = _own_copy(parts["model.rotary_emb"])

    def model_paths(self) -> dict[str, str]:
        """Each submodule's path in the stage → its path in the model ("layers.6.mlp" →
        "model.layers.6.mlp"): what a plan written for the model (`tp_plans.plan_for_part`) is read by."""
        return {
            path: ".".join(filter(None, (_MODEL_PATH_OF[head], rest)))
            for path, _ in self.named_modules()
            if path
            for head, _, rest in [path.partition(".")]
        }

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(tokens_or_hidden) if self.embed_tokens is not None else tokens_or_hidden
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        masks = _attention_masks(self.config, hidden)
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for index, layer in self.layers.items():
            hidden = layer(
                hidden,
                attention_mask=masks[_layer_type(self.config, int(index))],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
            )
        if self.norm is not None:
            hidden = self.norm(hidden)
        if self.lm_head is not None:
            hidden = self.lm_head(hidden)
        return hidden


def _own_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose tensors are clones (of fakes, fakes of the same mode): deepcopy
    alone would read a fake's data pointer. Tensors held twice (a buffer and a plain attribute) stay
    one tensor."""
    plain = [v for sub in module.modules() for v in vars(sub).values() if isinstance(v, torch.Tensor)]
    tensors = [*module.buffers(), *plain]
    memo: dict[int, Any] = {id(t): t.detach().clone() for t in tensors}
    return copy.deepcopy(module, memo)


def _layer_type(config: Any, index: int) -> str:
    """'full_attention' or 'sliding_attention', as the model's forward picks each layer's mask."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return layer_types[index]
    return "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"


def _attention_masks(config: Any, hidden: torch.Tensor) -> dict[str, Any]:
    """Each attention kind's mask, built by transformers' own mask functions, as the model builds them.

    Without `position_ids`: transformers reads them only to detect packed sequences (positions that
    restart within a row). A stage's positions are `arange(sequence)`, never packed, and eager finds
    that by reading them; on fakes it cannot read them, assumes packing and builds a full boolean
    mask (and a masked attention) that the eager step never has. Passing none gives both the eager
    answer.
    """
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kinds = {_layer_type(config, i) for i in range(config.num_hidden_layers)}
    masks: dict[str, Any] = {}
    if "full_attention" in kinds:
        masks["full_attention"] = create_causal_mask(**_mask_arguments(create_causal_mask, config, hidden))
    if "sliding_attention" in kinds:
        sliding = create_sliding_window_causal_mask
        masks["sliding_attention"] = sliding(**_mask_arguments(sliding, config, hidden))
    return masks


def _mask_arguments(mask_function: Callable[..., Any], config: Any, hidden: torch.Tensor) -> dict[str, Any]:
    """A mask function's arguments for a stage that runs without a cache, by the names this
    transformers release gives them: the cache is `cache` from 5.24, `past_key_values` before; the
    hidden states are `inputs_embeds` in 5, `input_embeds` in 4."""
    names = _parameter_names(mask_function)
    embeds = "input_embeds" if "input_embeds" in names else "inputs_embeds"
    arguments: dict[str, Any] = {"config": config, embeds: hidden, "attention_mask": None, "position_ids": None}
    arguments |= {name: None for name in ("cache", "past_key_values") if name in names}
    if "cache_position" in names:  # releases that locate the queries by it rather than by the cache
        arguments["cache_position"] = torch.arange(hidden.shape[1], device=hidden.device)
    return arguments


@functools.cache
def _parameter_names(function: Callable[..., Any]) -> frozenset[str]:
    """`function`'s parameter names, read once: stages build their masks at every forward."""
    return frozenset(inspect.signature(function).parameters)


def split_stages(model: nn.Module, stages: int, indices: list[int] | None = None) -> list[DecoderStage]:
    """`DecoderStage`s of `model` (all `stages`, or those at `indices`), sharing its modules.

    Raises PipelineSplitError as `plan_stages` does, and when transformers' mask functions, which
    the stages call, are not there (releases before `transformers.masking_utils`): each stage checks."""
    plans = plan_stages(model, stages)
    return [DecoderStage(model, plans[i]) for i in (range(stages) if indices is None else indices)]
