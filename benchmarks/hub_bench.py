"""Issue 34's bench: a DeepSeek-V3-shaped repo served by a local Hub, opened from its headers.

The repo has DeepSeek-V3's layout (163 shards; 61 decoder layers and the MTP layer; 256 routed
experts from layer 3 on; FP8 weights with their F32 `weight_scale_inv`; names and shapes written
from its published config) as header stubs over sparse files: the apparent size is the model's
(~690 GB), the disk use its headers'. Measured: opening it (`check_checkpoint(module,
"hub://...")`, every shard's header with two range requests) and materializing one expert's
tensors (recorded reads of three weights and their scales), as bytes transferred and seconds.

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

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import Report, Row, verdict  # noqa: E402  (after the path setup)

TOPIC = "hub"
CASES: dict = {}
REPO = "deepseek-ai/DeepSeek-V3"
SHARDS = 163
OPEN_S, OPEN_BYTES, EXPERT_RATIO = 10.0, 25_000_000, 1.05
_HIDDEN, _EXPERTS, _MOE, _DENSE, _VOCAB, _LAYERS = 7168, 256, 2048, 18432, 129280, 62  # 61 + the MTP layer
_SIZES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def _fp8(prefix: str, rows: int, cols: int) -> dict[str, tuple[str, list[int]]]:
    """A block-quantized linear: FP8 weight and one F32 scale per 128 x 128 block."""
    return {
        f"{prefix}.weight": ("F8_E4M3", [rows, cols]),
        f"{prefix}.weight_scale_inv": ("F32", [-(-rows // 128), -(-cols // 128)]),
    }


def _layer(i: int) -> dict[str, tuple[str, list[int]]]:
    p = f"model.layers.{i}"
    keys = {
        f"{p}.input_layernorm.weight": ("BF16", [_HIDDEN]),
        f"{p}.post_attention_layernorm.weight": ("BF16", [_HIDDEN]),
    }
    keys |= _fp8(f"{p}.self_attn.q_a_proj", 1536, _HIDDEN) | _fp8(f"{p}.self_attn.q_b_proj", 128 * 192, 1536)
    keys |= _fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 576, _HIDDEN) | _fp8(f"{p}.self_attn.kv_b_proj", 128 * 256, 512)
    keys |= _fp8(f"{p}.self_attn.o_proj", _HIDDEN, 128 * 128)
    keys |= {
        f"{p}.self_attn.q_a_layernorm.weight": ("BF16", [1536]),
        f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", [512]),
    }
    mlps = [f"{p}.mlp"] if i < 3 else [f"{p}.mlp.shared_experts", *(f"{p}.mlp.experts.{e}" for e in range(_EXPERTS))]
    width = _DENSE if i < 3 else _MOE
    for mlp in mlps:
        keys |= _fp8(f"{mlp}.gate_proj", width, _HIDDEN) | _fp8(f"{mlp}.up_proj", width, _HIDDEN)
        keys |= _fp8(f"{mlp}.down_proj", _HIDDEN, width)
    if i >= 3:
        keys |= {
            f"{p}.mlp.gate.weight": ("BF16", [_EXPERTS, _HIDDEN]),
            f"{p}.mlp.gate.e_score_correction_bias": ("F32", [_EXPERTS]),
        }
    return keys


def deepseek_v3_keys() -> dict[str, tuple[str, list[int]]]:
    """Every tensor of the checkpoint: name → (safetensors dtype, shape)."""
    keys = {"model.embed_tokens.weight": ("BF16", [_VOCAB, _HIDDEN]), "model.norm.weight": ("BF16", [_HIDDEN])}
    keys["lm_head.weight"] = ("BF16", [_VOCAB, _HIDDEN])
    for i in range(_LAYERS):
        keys |= _layer(i)
    return keys


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = _SIZES[dtype]
    for size in shape:
        n *= size
    return n


def write_repo(directory: Path) -> int:
    """The sparse repo in `directory` (config-free: headers, holes and the index); its apparent size."""
    keys = deepseek_v3_keys()
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
    return apparent


def measure(workdir: Path) -> dict[str, float]:
    """Serve the repo, open it, materialize one expert: seconds and bytes of each."""
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
    finally:
        server.close()
    return {
        "apparent": apparent,
        "keys": len(check.headers.entries),
        "open_s": open_s,
        "open_bytes": open_bytes,
        "expert_s": expert_s,
        "expert_bytes": expert_bytes,
        "expert_stored": stored,
    }


def bench(report: Report, quick: bool, timeout: float) -> None:
    """Measure in a fresh process (it repoints huggingface_hub at the local server), add two rows."""
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


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(measure(Path(sys.argv[2]))))
elif __name__ == "__main__":
    result = Report()
    bench(result, quick=False, timeout=600)
    for row in result.rows:
        print(f"{row.result}: {row.name}: {row.measured} (target {row.target}; {row.baseline}, {row.ratio})")
