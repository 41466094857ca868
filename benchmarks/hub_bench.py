"""Issue 34's bench: a DeepSeek-V3-shaped repo served by a local Hub, opened from its headers.

The repo has DeepSeek-V3's layout (163 shards; 61 decoder layers and the MTP layer; 256 routed
experts from layer 3 on; FP8 weights with their F32 `weight_scale_inv`; names and shapes written
from its published config) as header stubs over sparse files: the apparent size is the model's
(~690 GB), the disk use its headers'. Measured: opening it (`check_checkpoint(module,
"hub://...")`, every shard's header with two range requests) and materializing one expert's
tensors (recorded reads of three weights and their scales), as bytes transferred and seconds; then
`deferred_init(AutoModelForCausalLM.from_pretrained, ...)` of a bf16 variant (the same layout in
BF16, its config without `quantization_config`: see DEEPSEEK_V3_CONFIG), as a user opens a model
in a fresh kernel (a process of its own, first deferred_init included, the Hub over HTTP);
and `save_checkpoint` of a 271 MB Llama opened from the Hub, as stored and converted to fp32, as
peak RSS growth against the bytes written (in a process of its own: tests/support/hub_save_probe.py).

    .venv/bin/python benchmarks/hub_bench.py   # alone; `benchmarks/run.py` runs it as a topic
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import Report, Row, verdict  # noqa: E402  (after the path setup)

TOPIC = "hub"
CASES: dict = {}
REPO = "deepseek-ai/DeepSeek-V3"
SHARDS = 163
OPEN_S, OPEN_BYTES, EXPERT_RATIO, SAVE_RATIO = 10.0, 25_000_000, 1.05, 0.25
LLAMA_REPO = "test-org/llama-bf16"
LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, vocab_size=32000)
_HIDDEN, _EXPERTS, _MOE, _DENSE, _VOCAB, _LAYERS = 7168, 256, 2048, 18432, 129280, 62  # 61 + the MTP layer
_SIZES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
BF16_REPO = "test-org/DeepSeek-V3-bf16"
# deepseek-ai/DeepSeek-V3's config.json, less `quantization_config` (fp8, block 128 x 128) and
# `auto_map`: transformers 5.24 dequantizes FP8 on a machine without a GPU, and its dequantization
# refuses kv_a_proj_with_mqa ([576, 7168] weight, [5, 56] scales: 576 is no multiple of 5).
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": _VOCAB,
    "hidden_size": _HIDDEN,
    "intermediate_size": _DENSE,
    "moe_intermediate_size": _MOE,
    "num_hidden_layers": _LAYERS - 1,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": _EXPERTS,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "hidden_act": "silu",
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def _fp8(prefix: str, rows: int, cols: int, quantized: bool = True) -> dict[str, tuple[str, list[int]]]:
    """A block-quantized linear: FP8 weight and one F32 scale per 128 x 128 block (`quantized`),
    else a BF16 weight alone."""
    if not quantized:
        return {f"{prefix}.weight": ("BF16", [rows, cols])}
    return {
        f"{prefix}.weight": ("F8_E4M3", [rows, cols]),
        f"{prefix}.weight_scale_inv": ("F32", [-(-rows // 128), -(-cols // 128)]),
    }


def _layer(i: int, quantized: bool = True) -> dict[str, tuple[str, list[int]]]:
    p = f"model.layers.{i}"
    keys = {
        f"{p}.input_layernorm.weight": ("BF16", [_HIDDEN]),
        f"{p}.post_attention_layernorm.weight": ("BF16", [_HIDDEN]),
    }
    keys |= _fp8(f"{p}.self_attn.q_a_proj", 1536, _HIDDEN, quantized) | _fp8(
        f"{p}.self_attn.q_b_proj", 128 * 192, 1536, quantized
    )
    keys |= _fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 576, _HIDDEN, quantized) | _fp8(
        f"{p}.self_attn.kv_b_proj", 128 * 256, 512, quantized
    )
    keys |= _fp8(f"{p}.self_attn.o_proj", _HIDDEN, 128 * 128, quantized)
    keys |= {
        f"{p}.self_attn.q_a_layernorm.weight": ("BF16", [1536]),
        f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", [512]),
    }
    mlps = [f"{p}.mlp"] if i < 3 else [f"{p}.mlp.shared_experts", *(f"{p}.mlp.experts.{e}" for e in range(_EXPERTS))]
    width = _DENSE if i < 3 else _MOE
    for mlp in mlps:
        keys |= _fp8(f"{mlp}.gate_proj", width, _HIDDEN, quantized) | _fp8(f"{mlp}.up_proj", width, _HIDDEN, quantized)
        keys |= _fp8(f"{mlp}.down_proj", _HIDDEN, width, quantized)
    if i >= 3:
        keys |= {
            f"{p}.mlp.gate.weight": ("BF16", [_EXPERTS, _HIDDEN]),
            f"{p}.mlp.gate.e_score_correction_bias": ("F32", [_EXPERTS]),
        }
    return keys


def deepseek_v3_keys(quantized: bool = True) -> dict[str, tuple[str, list[int]]]:
    """Every tensor of the checkpoint: name → (safetensors dtype, shape); FP8 linears with their
    scales (`quantized`, as published), else BF16 ones."""
    keys = {"model.embed_tokens.weight": ("BF16", [_VOCAB, _HIDDEN]), "model.norm.weight": ("BF16", [_HIDDEN])}
    keys["lm_head.weight"] = ("BF16", [_VOCAB, _HIDDEN])
    for i in range(_LAYERS):
        keys |= _layer(i, quantized)
    return keys


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = _SIZES[dtype]
    for size in shape:
        n *= size
    return n


def write_repo(directory: Path, quantized: bool = True) -> int:
    """The sparse repo in `directory` (headers, holes and the index; and, unless `quantized`, the
    config without its `quantization_config`, for `from_pretrained`); its apparent size."""
    keys = deepseek_v3_keys(quantized)
    total = sum(_nbytes(*v) for v in keys.values())
    per_shard, shards, current, filled = total / SHARDS, [], {}, 0
    for name, (dtype, shape) in keys.items():
        current[name] = (dtype, shape)
        filled += _nbytes(dtype, shape)
        if filled >= per_shard * (len(shards) + 1) and len(shards) < SHARDS - 1:
            shards.append(current)
            current = {}
    shards.append(current)
    weight_map, apparent = {}, 0
    for number, tensors in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):06d}.safetensors"
        header, offset = {}, 0
        for name, (dtype, shape) in sorted(tensors.items()):
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + _nbytes(dtype, shape)]}
            offset += _nbytes(dtype, shape)
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        with open(directory / file, "wb") as stream:
            stream.write(len(text).to_bytes(8, "little") + text)
            stream.truncate(8 + len(text) + offset)
        apparent += 8 + len(text) + offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    if not quantized:
        (directory / "config.json").write_text(json.dumps(DEEPSEEK_V3_CONFIG))
    return apparent


def measure(workdir: Path) -> dict[str, float]:
    """Serve the repo, open it, materialize one expert; open the bf16 variant with from_pretrained;
    save a Llama opened from the Hub: seconds, bytes and peak memory of each."""
    import safetensors
    import torch
    from huggingface_hub import constants

    import explorer
    from explorer.record.hub_open import hub_checkpoint
    from tests.support.hub_server import serve_hub

    repo = workdir / "repo"
    repo.mkdir()
    apparent = write_repo(repo)
    server = serve_hub()
    hub = next(server)
    hub.add_repo(REPO, repo)
    os.environ["EXPLORER_HUB_CACHE"] = str(workdir / "cache")
    constants.ENDPOINT = hub.endpoint
    constants.HUGGINGFACE_CO_URL_TEMPLATE = hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    constants.HF_HOME = str(workdir / "hf")
    constants.HF_HUB_CACHE = str(workdir / "hf" / "hub")
    try:
        start = time.perf_counter()
        check = explorer.check_checkpoint(torch.nn.Module(), f"hub://{REPO}")
        open_s, open_bytes = time.perf_counter() - start, hub.bytes_served()
        expert = "model.layers.3.mlp.experts.7"
        names = [
            f"{expert}.{proj}_proj.{part}" for proj in ("gate", "up", "down") for part in ("weight", "weight_scale_inv")
        ]
        stubs = Path(hub_checkpoint(f"hub://{REPO}"))
        index = json.loads((stubs / "model.safetensors.index.json").read_text())["weight_map"]

        class Expert(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                for name in names:
                    with safetensors.safe_open(str(stubs / index[name]), framework="pt") as handle:
                        self.register_buffer(name.replace(".", "_"), handle.get_tensor(name))

        module = explorer.deferred_init(Expert)
        before = hub.bytes_served()
        start = time.perf_counter()
        explorer.materialize_module(module)
        expert_s, expert_bytes = time.perf_counter() - start, hub.bytes_served() - before
        stored = sum(b.numel() * b.element_size() for b in module.buffers())
        bf16 = _from_pretrained(hub, workdir)
        saves = {dtype: _save_from_hub(hub, workdir, dtype) for dtype in ("none", "float32")}
    finally:
        server.close()
    return {
        **{f"save_{dtype}_{name}": value for dtype, got in saves.items() for name, value in got.items()},
        **bf16,
        "apparent": apparent,
        "keys": len(check.headers.entries),
        "open_s": open_s,
        "open_bytes": open_bytes,
        "expert_s": expert_s,
        "expert_bytes": expert_bytes,
        "expert_stored": stored,
    }


def _from_pretrained(hub: Any, workdir: Path) -> dict[str, float]:
    """`deferred_init(AutoModelForCausalLM.from_pretrained, BF16_REPO)` of the bf16 variant of the
    repo, as a user opens a model in a fresh kernel: in a process of its own (`_open_child`), which
    pays the first deferred_init's one-time costs (FakeTensorMode's first use imports
    torch._dynamo) and reaches this process's Hub over HTTP. Seconds, bytes served (config, index
    and headers), parameters, tensors read."""
    repo = workdir / "repo-bf16"
    repo.mkdir()
    apparent = write_repo(repo, quantized=False)
    hub.add_repo(BF16_REPO, repo)
    before = hub.bytes_served()
    got = _hub_child([__file__, "--open", BF16_REPO], hub, workdir, "open")
    return {**got, "bf16_bytes": hub.bytes_served() - before, "bf16_apparent": apparent}


def _open_child(repo_id: str) -> dict[str, float]:
    """Child of `_from_pretrained`: the timed open, after the imports a notebook has made."""
    import torch
    from transformers import AutoModelForCausalLM

    import explorer

    start = time.perf_counter()
    model = explorer.deferred_init(AutoModelForCausalLM.from_pretrained, repo_id, dtype=torch.bfloat16)
    seconds = time.perf_counter() - start
    return {
        "bf16_s": seconds,
        "bf16_params": sum(p.numel() for p in model.parameters()),
        "bf16_reads": len(explorer.inspect(model).reads),
    }


def _save_from_hub(hub: Any, workdir: Path, dtype: str) -> dict[str, float]:
    """`save_checkpoint` of the Llama repo opened with `from_pretrained` under `deferred_init`, in a
    process of its own (tests/support/hub_save_probe.py: this one holds the Hub's buffers): its peak
    RSS growth, the bytes written and served, in `dtype` ("none": as stored, bf16)."""
    repo = workdir / "llama"
    if not repo.is_dir():
        import torch
        import transformers

        config = transformers.LlamaConfig(**LLAMA, tie_word_embeddings=True)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(repo, max_shard_size="100MB")
        hub.add_repo(LLAMA_REPO, repo)
    before = hub.bytes_served(".safetensors")
    probe = ["-m", "tests.support.hub_save_probe", LLAMA_REPO, str(workdir / f"out-{dtype}"), dtype]
    got = _hub_child(probe, hub, workdir, f"save-{dtype}")
    stored = sum(p.stat().st_size for p in repo.glob("*.safetensors"))
    return {**got, "served": hub.bytes_served(".safetensors") - before, "stored": stored}


def _hub_child(arguments: list[str], hub: Any, workdir: Path, name: str) -> dict[str, Any]:
    """The last JSON line of `python arguments...` run against `hub` over HTTP, with caches of its
    own (`name`) and no token."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(workdir / f"hf-{name}"),
        "EXPLORER_HUB_CACHE": str(workdir / f"cache-{name}"),
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    env.pop("HF_TOKEN", None)
    child = subprocess.run(
        [sys.executable, *arguments], env=env, cwd=HERE.parent, capture_output=True, text=True, check=True
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


def bench(report: Report, quick: bool, timeout: float) -> None:
    """Measure in a fresh process (it repoints huggingface_hub at the local server), add five rows."""
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.run(
            [sys.executable, __file__, "--child", tmp], capture_output=True, text=True, timeout=timeout, check=False
        )
    if child.returncode != 0:
        report.errors.append(f"hub_bench: {child.stderr.strip().splitlines()[-1:]}")
        return
    got = json.loads(child.stdout.strip().splitlines()[-1])
    report.add(
        Row(
            f"open a DeepSeek-V3-shaped Hub repo ({SHARDS} shards, {got['keys']:,.0f} tensors, "
            f"{got['apparent'] / 1e9:,.0f} GB apparent), headers only",
            f"{got['open_s']:.2f} s, {got['open_bytes'] / 1e6:.1f} MB",
            "-",
            "-",
            f"≤ {OPEN_S:.0f} s, ≤ {OPEN_BYTES / 1e6:.0f} MB",
            verdict(got["open_s"] <= OPEN_S and got["open_bytes"] <= OPEN_BYTES),
        )
    )
    ratio = got["expert_bytes"] / got["expert_stored"]
    report.add(
        Row(
            "one expert of layer 3 materialized from the Hub repo (3 FP8 weights + scales)",
            f"{got['expert_bytes'] / 1e6:.1f} MB in {got['expert_s']:.2f} s",
            f"{got['expert_stored'] / 1e6:.1f} MB stored",
            f"{ratio:.3f}×",
            f"≤ {EXPERT_RATIO}×",
            verdict(ratio <= EXPERT_RATIO),
        )
    )
    report.add(
        Row(
            f"`deferred_init(AutoModelForCausalLM.from_pretrained, ...)` of its bf16 variant in a fresh process "
            f"({got['bf16_params'] / 1e9:,.0f}B parameters, {got['bf16_reads']:,.0f} tensors read, "
            f"{got['bf16_apparent'] / 1e12:,.2f} TB apparent; config without quantization_config)",
            f"{got['bf16_s']:.2f} s, {got['bf16_bytes'] / 1e6:.1f} MB",
            "-",
            "-",
            f"≤ {OPEN_S:.0f} s, ≤ {OPEN_BYTES / 1e6:.0f} MB",
            verdict(got["bf16_s"] <= OPEN_S and got["bf16_bytes"] <= OPEN_BYTES),
        )
    )
    for dtype, what in (("none", "as stored (bf16)"), ("float32", "converted to fp32")):
        save = {
            name: got[f"save_{dtype}_{name}"] for name in ("peak_growth", "saved_bytes", "largest", "served", "stored")
        }
        ratio = save["peak_growth"] / save["saved_bytes"]
        report.add(
            Row(
                f"save_checkpoint of a Llama opened from the Hub ({save['stored'] / 1e6:.0f} MB, 3 shards), {what}: "
                f"peak RSS growth vs bytes written (largest tensor {save['largest'] / 1e6:.0f} MB)",
                f"+{save['peak_growth'] / 1e6:.1f} MB peak; {save['served'] / save['stored']:.3f}× the shards served",
                f"{save['saved_bytes'] / 1e6:.0f} MB written",
                f"{ratio:.3f}×",
                f"≤ {SAVE_RATIO}×, served ≤ 1.001×",
                verdict(ratio <= SAVE_RATIO and save["served"] <= 1.001 * save["stored"]),
            )
        )


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(measure(Path(sys.argv[2]))))
elif __name__ == "__main__" and sys.argv[1:2] == ["--open"]:
    print(json.dumps(_open_child(sys.argv[2])))
elif __name__ == "__main__":
    result = Report()
    bench(result, quick=False, timeout=600)
    for row in result.rows:
        print(f"{row.result}: {row.name}: {row.measured} (target {row.target}; {row.baseline}, {row.ratio})")
