"""CUDA materialization against eager CUDA construction, bit for bit: run on a machine with a GPU.

    python benchmarks/cuda_parity.py            # prints one line per check and a closing count

CI has no GPU, so this is not part of `make test`; docs/benchmarks.md records where and when it
last ran. Each check builds the same model eagerly and deferred from one seed and compares every
parameter and buffer bitwise:

- recorded on CUDA, materialized on CUDA with rng="eager" (CUDA's Philox generator replayed), whole
  and layer by layer from the last one (earlier random ops re-run on scratch tensors);
- recorded on the CPU, materialized onto CUDA (drawn on the CPU generator, then moved);
- the global CPU and CUDA generators unchanged by materialization;
- timm models recorded on CUDA (ViT, Swin, ConvNeXt, DeiT, BEiT, RegNet, ResNet), whose constructors
  draw with `trunc_normal_` and friends on CUDA fakes;
- the Philox offset model (explorer/replay/philox.py) against the live generator: the offset each
  kernel reserves, for a spread of ops, dtypes and sizes (one past 32-bit indexing);
- a timing line: one late Llama layer on CUDA, eager parity, against building that layer eagerly;
- no synchronisation per op: `torch.cuda.set_sync_debug_mode("warn")` counts the synchronising
  calls of `materialize_module` of a Llama recorded on CUDA, which must not grow with its layers;
- rows drawn alone (`replay.rows.draw_rows`, what each FSDP2 rank draws) against the rows of the
  whole tensor, for fills recorded on CUDA (the element mapping of explorer/replay/philox_rows.py,
  including a tensor split for 32-bit indexing, and fills followed by pointwise ops: timm's
  trunc_normal_, a zeroed padding row) and on the CPU, with rng="eager" and "fast".

It runs on any tested torch release as it is (no backport: explorer/_torch_compat answers for the
release) and prints the release it ran on first.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from explorer import deferred_init, materialize_module
from explorer._torch_compat import is_tested_release

# PARITY_DEVICE=cpu runs the same checks on the CPU (a smoke run of this script where there is no GPU).
DEVICE = os.environ.get("PARITY_DEVICE", "cuda")
CUDA = torch.device(DEVICE)


def tiny_llama(device: str | None = None, layers: int = 4) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, vocab_size=1000)
    if device is None:
        return LlamaForCausalLM(config)
    with torch.device(device):
        return LlamaForCausalLM(config)


class Mixed(nn.Module):
    """Factories with device=, in-place random inits, a constant buffer and a value read."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(300, 64, padding_idx=0, device=device)
        self.proj = nn.Linear(64, 48, device=device)
        self.conv = nn.Conv2d(3, 8, 3, device=device)
        self.norm = nn.LayerNorm(48, device=device)
        self.scale = nn.Parameter(torch.randn(48, device=device) * 0.02)
        nn.init.trunc_normal_(self.proj.weight, std=0.02)
        nn.init.orthogonal_(self.conv.weight)
        self.register_buffer("steps", torch.arange(10, device=device).float().sqrt())
        self.threshold = float(self.scale.abs().max().item())


# timm models whose CUDA recording failed on torch 2.11 before the compat layer (issue 32), and two
# that passed; small configurations of each family, built on the device.
TIMM_MODELS = (
    "vit_small_patch16_224", "vit_base_patch16_224", "swin_tiny_patch4_window7_224", "convnext_tiny",
    "deit_small_patch16_224", "beit_base_patch16_224", "regnety_002", "resnet50", "efficientnet_b0",
)


def timm_on(device: str, name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        with torch.device(device):
            return timm.create_model(name, pretrained=False)

    return build


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def compare(eager: nn.Module, built: nn.Module, device: torch.device) -> None:
    want, got = state(eager), state(built)
    assert want.keys() == got.keys(), sorted(set(want) ^ set(got))
    differ = []
    for name, value in want.items():
        other = got[name]
        assert other.device.type == device.type, f"{name} on {other.device}, expected {device}"
        assert other.dtype == value.dtype and other.shape == value.shape, name
        if not torch.equal(other.to(value.device), value):
            differ.append(name)
    assert not differ, f"{len(differ)} of {len(want)} tensors differ from eager: {differ[:8]}"


def generators() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if DEVICE == "cuda":
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def check_cuda_recorded(build: Callable[[], nn.Module]) -> None:
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = deferred_init(build)
    before = generators()
    materialize_module(deferred, device=DEVICE)
    after = generators()
    compare(eager, deferred, CUDA)
    moved = [key for key in before if not torch.equal(before[key], after[key])]
    assert not moved, f"materialization moved the {moved} generator(s): {before} -> {after}"


def check_last_layer_first() -> None:
    torch.manual_seed(1)
    eager = tiny_llama(DEVICE)
    torch.manual_seed(1)
    deferred = deferred_init(tiny_llama, DEVICE)
    layers = deferred.model.layers
    for index in reversed(range(len(layers))):
        materialize_module(layers[index], device=DEVICE)
        compare(eager.model.layers[index], layers[index], CUDA)
    materialize_module(deferred, device=DEVICE)
    compare(eager, deferred, CUDA)


def check_cpu_recorded_onto_cuda() -> None:
    torch.manual_seed(2)
    eager = tiny_llama()
    torch.manual_seed(2)
    deferred = deferred_init(tiny_llama)
    materialize_module(deferred, device=DEVICE)
    compare(eager, deferred, CUDA)


def check_late_layer_timing() -> str:
    """Llama-2-7B shapes, 32 layers recorded on CUDA: `layers[31]` materialized with eager parity."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)

    def build() -> nn.Module:
        with torch.device(DEVICE):
            return LlamaForCausalLM(config)

    torch.manual_seed(3)
    deferred = deferred_init(build)
    synchronize()
    start = time.perf_counter()
    materialize_module(deferred.model.layers[31], device=DEVICE)
    synchronize()
    layer_s = time.perf_counter() - start
    torch.manual_seed(3)
    start = time.perf_counter()
    eager = build()
    synchronize()
    eager_s = time.perf_counter() - start
    compare(eager.model.layers[31], deferred.model.layers[31], CUDA)
    del eager
    return f"7B layers[31] on CUDA, eager parity: {layer_s:.2f} s; eager construction of the whole 7B: {eager_s:.2f} s"


def check_no_synchronisation_per_op() -> str:
    """The synchronising CUDA calls of whole-model materialization do not grow with the model."""
    import warnings

    counts = {}
    for layers in (2, 8):
        torch.manual_seed(6)
        deferred = deferred_init(tiny_llama, DEVICE, layers)
        synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                materialize_module(deferred, device=DEVICE)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[layers] = [str(w.message)[:80] for w in caught if "synchroniz" in str(w.message)]
    assert len(counts[2]) == len(counts[8]), f"synchronising calls grow with the layers: {counts}"
    return f"{len(counts[8])} synchronising calls for 2 and for 8 layers: {sorted(set(counts[8]))[:3]}"


class Fills(nn.Module):
    """One parameter per kernel and layout the row mapping covers, recorded on `device`."""

    def __init__(self, device: str, big: bool) -> None:
        super().__init__()
        on = {"device": device}
        self.warm = nn.Parameter(torch.empty(3000, **on).uniform_())  # the fills below start mid-stream
        self.embedding = nn.Parameter(torch.empty((128256, 8192) if big else (1000, 64), **on).normal_(std=0.02))
        self.down = nn.Parameter(torch.empty((8192, 28672) if big else (512, 96), **on).uniform_(-0.01, 0.01))
        self.small = nn.Parameter(torch.empty(24, 100, **on).normal_())  # below one grid of threads
        self.float64 = nn.Parameter(torch.empty(4099, 1037, dtype=torch.float64, **on).normal_())  # unroll 2
        self.bf16 = nn.Parameter(torch.empty(3001, 4096, dtype=torch.bfloat16, **on).uniform_())
        self.ints = nn.Parameter(torch.empty(4097, 999, **on).random_(0, 1000), requires_grad=False)
        # made by position after the fill: timm's inverse-CDF trunc_normal_, and a zeroed padding row
        with torch.no_grad():
            trunc = torch.empty(2048, 1000, **on).uniform_(-0.95, 0.95).erfinv_().mul_(0.02 * 2**0.5).add_(0.01)
            self.trunc = nn.Parameter(trunc.clamp_(min=-0.04, max=0.04))
            padded = torch.empty(5000, 64, **on).normal_(std=0.02)
            padded[1].zero_()
            self.padded = nn.Parameter(padded)


def check_rows_drawn_alone() -> str:
    """Each of 8 ranks' rows, drawn alone, equal those rows of the whole tensor (what FSDP2 ranks
    get from `fully_shard_deferred`)."""
    from explorer import materialize_tensor
    from explorer.replay.rows import draw_rows

    drawn = whole_s = rows_s = 0.0
    for recorded_on in (DEVICE, "cpu"):
        for rng in ("eager", "fast"):
            torch.manual_seed(5)
            module = deferred_init(Fills, recorded_on, big=DEVICE == "cuda" and recorded_on == DEVICE)
            for name, fake in module.named_parameters():
                if name == "warm":
                    continue
                synchronize()
                start = time.perf_counter()
                whole = materialize_tensor(fake, device=DEVICE, rng=rng)
                synchronize()
                whole_s += time.perf_counter() - start
                count = fake.shape[0]
                for rank in range(8):
                    first, stop = rank * count // 8, (rank + 1) * count // 8
                    synchronize()
                    start = time.perf_counter()
                    rows = draw_rows(fake, first, stop, rng, name, device=DEVICE)
                    synchronize()
                    rows_s += time.perf_counter() - start
                    # every one is drawn alone: CPU fills sent to CUDA with rng="fast" too (seeded there)
                    assert rows is not None, (name, rng, recorded_on, rank)
                    drawn += 1
                    assert rows.device == whole.device, (name, rows.device)
                    assert torch.equal(rows, whole[first:stop]), (name, rng, recorded_on, rank)
                del whole
    return (
        f"{int(drawn)} rank slices equal to the whole tensors' rows; "
        f"whole {whole_s:.2f} s, all ranks' rows {rows_s:.2f} s"
    )


# (label, dtype, shape, op run on a fresh tensor, its aten op, the arguments the offset model reads)
LIVE_OFFSET_CASES = [
    ("normal_", dt, shape, lambda t: t.normal_(), torch.ops.aten.normal_.default, {})
    for dt in (torch.float32, torch.bfloat16, torch.float64)
    for shape in ((1,), (1000,), (4096, 4096), (11008, 4096), (3, 5, 7))
] + [
    ("uniform_", torch.float32, (128256, 8192), lambda t: t.uniform_(), torch.ops.aten.uniform_.default, {}),
    ("uniform_", torch.float16, (8192, 28672), lambda t: t.uniform_(), torch.ops.aten.uniform_.default, {}),
    ("bernoulli_(p)", torch.float32, (5000, 7), lambda t: t.bernoulli_(0.3), torch.ops.aten.bernoulli_.float, {}),
    ("exponential_", torch.bfloat16, (4096, 11008), lambda t: t.exponential_(), torch.ops.aten.exponential_.default,
     {}),
]


def check_offset_model_against_the_live_generator() -> str:
    """The offset model (explorer/replay/philox.py) against what each kernel reserves on this GPU."""
    from explorer._torch_compat.generators import cuda_state_fields
    from explorer.replay.philox import device_properties, offset_increment

    properties = device_properties("cuda:0")
    assert properties is not None, "no launch limits read for cuda:0"
    wrong = []
    for label, dtype, shape, run, op, arguments in LIVE_OFFSET_CASES:
        tensor = torch.empty(shape, dtype=dtype, device=CUDA)
        before = cuda_state_fields(torch.cuda.get_rng_state())[1]
        run(tensor)
        after = cuda_state_fields(torch.cuda.get_rng_state())[1]
        model = offset_increment(op, dtype, shape, properties, arguments=arguments)
        if model != after - before:
            wrong.append(f"{label} {dtype} {shape}: live {after - before}, model {model}")
        del tensor
    assert not wrong, "; ".join(wrong)
    return f"{len(LIVE_OFFSET_CASES)} ops, each increment as the model says ({properties})"


CHECKS: dict[str, Callable[[], object]] = {
    "offset model against the live generator": check_offset_model_against_the_live_generator,
    "nn.Linear recorded on cuda": lambda: check_cuda_recorded(lambda: nn.Linear(64, 32, device=DEVICE)),
    "mixed inits recorded on cuda": lambda: check_cuda_recorded(lambda: Mixed(DEVICE)),
    "tiny Llama recorded on cuda": lambda: check_cuda_recorded(lambda: tiny_llama(DEVICE)),
    "tiny Llama, layers materialized last first": check_last_layer_first,
    "tiny Llama recorded on cpu, materialized onto cuda": check_cpu_recorded_onto_cuda,
    **{f"timm {name} recorded on cuda": (lambda name=name: check_cuda_recorded(timm_on(DEVICE, name)))
       for name in TIMM_MODELS},
    "7B late layer on cuda": check_late_layer_timing,
    "rows drawn alone, as FSDP2 ranks draw them": check_rows_drawn_alone,
    "no synchronisation per op": check_no_synchronisation_per_op,
}
if DEVICE != "cuda":  # the 7B eager baseline needs 27 GB: a GPU's memory, not a smoke run's
    del CHECKS["7B late layer on cuda"], CHECKS["offset model against the live generator"]
    del CHECKS["no synchronisation per op"]  # a CUDA debug mode


def main() -> int:
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke run)"
    print(f"torch {torch.__version__} ({'tested release' if is_tested_release() else 'outside the tested releases'}), "
          f"{where}", flush=True)
    passed = failed = 0
    for name, check in CHECKS.items():
        try:
            detail = check()
        except Exception:  # report every check, then the count
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        else:
            passed += 1
            print(f"ok   {name}" + (f": {detail}" if isinstance(detail, str) else ""), flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
