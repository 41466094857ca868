"""One rank of the multi-process tests in test_distributed.py (not collected by pytest).

    python -m tests.support.distributed_worker OUT_DIR SCENARIO[,SCENARIO...]

with RANK, WORLD_SIZE and MASTER_PORT set, as torchrun would (the test forks `run_rank` instead,
so each rank starts with torch already imported). The group lives on 127.0.0.1 only. Each
scenario builds a model under deferred_init, shards it across the gloo group, and leaves what the
test asserts on in OUT_DIR: rank 0 saves the gathered (`full_tensor()`) state as
`<scenario>.pt`; every rank writes `<scenario>-rank<r>.json` (local shapes, memory numbers, or
the error it raised). The assertions themselves live in the test, in another process.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from explorer import deferred_init, plan_devices
from explorer.distributed import distribute_deferred, fully_shard_deferred
from explorer.errors import DistributedMaterializationError

SEED = 0


# -- models --------------------------------------------------------------------------------------
class Noise(nn.Module):
    """A random buffer drawn between parameters, and a view of it registered as a second buffer."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(n))
        self.register_buffer("window", self.table[1:4], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[-1]]


def tied_sequential() -> nn.Sequential:
    """Embedding tied to the output head (11 rows: uneven over 2 ranks), BatchNorm buffers, a
    random buffer drawn between parameter inits."""
    embed = nn.Embedding(11, 8)
    head = nn.Linear(8, 11, bias=False)
    head.weight = embed.weight
    return nn.Sequential(embed, nn.Linear(8, 8), Noise(8), nn.BatchNorm1d(3), nn.Linear(8, 8), head)


def tied_input() -> torch.Tensor:
    return torch.arange(6).reshape(2, 3) % 11


def big_sequential() -> nn.Sequential:
    """~134 MB of float32: eight 2048x2048 linear layers."""
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])


def small_vit() -> nn.Module:
    """timm's ViT: trunc_normal_ (uniform_, erfinv_, mul_, add_, clamp_) weights, zero biases,
    LayerNorms of ones: every parameter made by position, so each rank draws its rows alone."""
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32, num_classes=10)


def tiny_llama() -> nn.Module:
    from tests.support.hf_configs import HF_BY_NAME

    arch = HF_BY_NAME["llama"]
    config = arch.config()
    torch.manual_seed(SEED)
    return deferred_init(arch.cls, config)


def llama_input() -> dict[str, torch.Tensor]:
    from tests.support.hf_configs import HF_BY_NAME

    return HF_BY_NAME["llama"].inputs()


# -- helpers -------------------------------------------------------------------------------------
def gathered_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict (a collective: every rank calls it)."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in module.state_dict().items()}


def local_shapes(module: nn.Module) -> dict[str, list[int]]:
    return {n: list(p.to_local().shape) if isinstance(p, DTensor) else list(p.shape)
            for n, p in module.named_parameters()}


def local_bytes(module: nn.Module) -> int:
    """Bytes this rank owns: local parameter storages (FSDP's padded shards) and buffers."""
    storages: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes(reset_worked: bool) -> int:
    if reset_worked:
        return _status_kib("VmHWM") * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # since start: an upper bound


def by_layer(module: nn.Module, mesh: DeviceMesh) -> Callable[[nn.Module], None]:
    """FSDP2 as torchtitan applies it: each decoder layer, then the root."""

    def shard(root: nn.Module) -> None:
        for layer in root.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(root, mesh=mesh)

    return shard


# -- scenarios -----------------------------------------------------------------------------------
def llama_fsdp(mesh: DeviceMesh, rng: str) -> dict[str, Any]:
    model = tiny_llama()
    fully_shard_deferred(model, mesh, shard=by_layer(model, mesh), rng=rng)
    shapes = local_shapes(model)  # before forward: FSDP leaves the root unsharded after it
    state = gathered_state(model)
    with torch.no_grad():
        logits = model.eval()(**llama_input()).logits
    return {"state": state, "logits": logits, "local_shapes": shapes}


def tied_fsdp(mesh: DeviceMesh) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    plan = plan_devices(model, {"cpu": "1GB"}, world_size=mesh.size())  # what each rank will hold
    fully_shard_deferred(model, mesh)
    shapes = local_shapes(model)  # before forward: FSDP leaves the root unsharded after it
    own_bytes = local_bytes(model)
    with torch.no_grad():
        output = model.eval()(tied_input())
    return {"state": gathered_state(model), "output": output, "local_shapes": shapes,
            "tied": model[0].weight is model[5].weight,
            "window_shares_table": model[2].window.data_ptr() == model[2].table.data_ptr() + 4,
            "own_bytes": own_bytes, "planned_bytes": int(plan.table["planned_bytes"].iloc[0])}


def tied_outside_units(mesh: DeviceMesh) -> dict[str, Any]:
    """Only the middle linear sharded: the tied embedding and head stay plain parameters."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    fully_shard_deferred(model, mesh, shard=lambda root: fully_shard(root[1], mesh=mesh))
    with torch.no_grad():
        output = model.eval()(tied_input())
    return {"state": gathered_state(model), "output": output, "tied": model[0].weight is model[5].weight}


def placement_mistakes(mesh: DeviceMesh) -> dict[str, Any]:
    """distribute_deferred given placements that fit no parameter: each refused, the model unchanged."""
    from explorer import is_deferred

    messages = {}
    for label, placements in {
        "too many": {"1.weight": [Shard(0), Shard(1)]},
        "no such dim": {"1.weight": [Shard(2)]},
        "typo": {"1.wieght": [Shard(0)]},
        "tied second name": {"5.weight": [Shard(0)]},
        "partial": {"4.weight": [Partial()]},
    }.items():
        model = deferred_init(tied_sequential)
        try:
            distribute_deferred(model, mesh, placements)
        except DistributedMaterializationError as error:
            messages[label] = str(error).splitlines()[-1]
        messages[label + " deferred"] = all(is_deferred(p) for p in model.parameters())
    # a placements function that fails while parameters are being filled (after every check
    # passed): the parameters filled before it are put back, so nothing is half-distributed
    model, asked = deferred_init(tied_sequential), []

    def flaky(name: str, fake: torch.Tensor) -> list[Shard]:
        asked.append(name)
        if asked.count(name) == 2 and name == "4.weight":
            raise RuntimeError("placement service unavailable")
        return [Shard(0)]

    try:
        distribute_deferred(model, mesh, flaky)
    except DistributedMaterializationError as error:
        messages["flaky"] = str(error).splitlines()[-1]
    messages["flaky deferred"] = [is_deferred(t) for t in model.state_dict().values()]
    messages["flaky tied"] = model[0].weight is model[5].weight
    return {"state": None, **messages}


def tied_dtensor(mesh: DeviceMesh) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    # column-wise first linear, row-wise embedding/head (tied: named by the first name), rest replicated
    distribute_deferred(model, mesh, {"1.weight": [Shard(1)], "0.weight": [Shard(0)]})
    return {"state": gathered_state(model), "local_shapes": local_shapes(model),
            "placements": {n: str(p.placements) for n, p in model.named_parameters()},
            "tied": model[0].weight is model[5].weight}


def tied_dtensor_2d(mesh: DeviceMesh) -> dict[str, Any]:
    """`distribute_deferred` over a 2-D mesh (1 × world), one parameter named, the rest left to the default."""
    grid = init_device_mesh("cpu", (1, mesh.size()), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    distribute_deferred(model, grid, {"1.weight": [Replicate(), Shard(1)]})
    return {"state": gathered_state(model), "local_shapes": local_shapes(model),
            "placements": {n: str(p.placements) for n, p in model.named_parameters()}}


def vit_fsdp(mesh: DeviceMesh) -> dict[str, Any]:
    import explorer.distributed as distributed

    torch.manual_seed(SEED)
    model = deferred_init(small_vit)
    planned = {k: int(v) for k, v in distributed.shard_fill_plan(model)["made"].value_counts().items()}
    drawn: list[bool] = []  # per parameter: were its rows drawn alone (draw_rows gave them)?
    original = distributed.draw_rows

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        rows = original(*args, **kwargs)
        drawn.append(rows is not None)
        return rows

    distributed.draw_rows = counted
    try:
        fully_shard_deferred(model, mesh)
    finally:
        distributed.draw_rows = original
    return {"state": gathered_state(model), "planned": planned, "drawn": drawn}


def memory(mesh: DeviceMesh) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = deferred_init(big_sequential)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    planned = int(plan_devices(model, {"cpu": "1GB"}, world_size=mesh.size()).table["planned_bytes"].iloc[0])
    gc.collect()
    reset_worked = reset_peak_rss()
    before = _status_kib("VmRSS") * 1024
    fully_shard_deferred(model, mesh)
    peak = peak_rss_bytes(reset_worked)
    return {"growth": peak - before, "own_bytes": local_bytes(model), "planned_bytes": planned, "largest": largest,
            "full_bytes": full_bytes, "peak_reset": reset_worked, "state": None}


def failing_rank_1(mesh: DeviceMesh) -> dict[str, Any]:
    from explorer import is_deferred

    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    if dist.get_rank() == 1:
        source = torch.ones(model[1].weight.shape)
        with torch.no_grad():
            model[1].weight.copy_(source)  # recorded with `source` by reference...
        source.add_(1)  # ...which a user's bug on one rank changes: refused at materialization
    try:
        fully_shard_deferred(model, mesh)
    except DistributedMaterializationError as error:
        # every rank's module as it was, the healthy rank's too
        return {"state": None, "error": str(error), "failed_ranks": sorted(error.failures),
                "class": type(model).__name__, "deferred": [is_deferred(t) for t in model.state_dict().values()]}
    return {"state": None}


def refused_then_sharded(mesh: DeviceMesh) -> dict[str, Any]:
    """Two refusals that must change nothing (an absent device, found before anything runs; a
    bug in the user's shard function, after the fakes were swapped out), then the same module
    sharded; and an option fully_shard refuses, which leaves its module unusable, saying so."""
    from explorer import is_deferred

    def shard_with_a_typo(module: nn.Module) -> None:
        for layer in module.layers:  # a Sequential has no .layers
            fully_shard(layer, mesh=mesh)

    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    messages, deferred = {}, {}
    for label, options in {"device": {"device": "cuda:7"}, "shard": {"shard": shard_with_a_typo}}.items():
        try:
            fully_shard_deferred(model, mesh, **options)
        except DistributedMaterializationError as error:
            messages[label] = str(error)
        deferred[label] = [type(model).__name__, all(is_deferred(t) for t in model.state_dict().values()),
                           model[0].weight is model[5].weight]
    fully_shard_deferred(model, mesh)
    try:
        fully_shard_deferred(deferred_init(tied_sequential), mesh, reshard_after_forward="sometimes")
    except DistributedMaterializationError as error:
        messages["option"] = str(error)
    return {"state": gathered_state(model), "messages": messages, "deferred": deferred}


def partly_materialized(mesh: DeviceMesh) -> dict[str, Any]:
    from explorer import materialize_module

    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    materialize_module(model[3])  # the BatchNorm: real now, so to_empty would wipe it
    fully_shard_deferred(model, mesh)
    return {"state": None}


def partly_materialized_dtensor(mesh: DeviceMesh) -> dict[str, Any]:
    from explorer import materialize_module

    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    materialize_module(model[3])
    distribute_deferred(model, mesh)
    return {"state": None}


def exiting_rank_1(mesh: DeviceMesh) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = deferred_init(tied_sequential)
    if dist.get_rank() == 1:
        os._exit(3)  # dies without a word: rank 0 must not wait for it forever
    fully_shard_deferred(model, mesh)
    return {"state": None}


SCENARIOS: dict[str, Callable[[DeviceMesh], dict[str, Any]]] = {
    "llama-eager": lambda mesh: llama_fsdp(mesh, "eager"),
    "llama-fast": lambda mesh: llama_fsdp(mesh, "fast"),
    "tied-fsdp": tied_fsdp,
    "tied-dtensor": tied_dtensor,
    "tied-dtensor-2d": tied_dtensor_2d,
    "tied-outside-units": tied_outside_units,
    "placement-mistakes": placement_mistakes,
    "vit-fsdp": vit_fsdp,
    "memory": memory,
    "failing-rank-1": failing_rank_1,
    "refused-then-sharded": refused_then_sharded,
    "partly-materialized": partly_materialized,
    "partly-materialized-dtensor": partly_materialized_dtensor,
    "exiting-rank-1": exiting_rank_1,
}


def run_rank(rank: int, world: int, port: int, out: Path, scenarios: list[str], log: Path | None = None) -> None:
    """Rank `rank` of `world` on 127.0.0.1:`port`: run `scenarios`, leaving results in `out`.

    Also the target of a forked process (the test forks to skip re-importing torch): `log`
    then receives its stdout and stderr, and it runs single-threaded, as DataLoader workers do,
    since OpenMP thread pools do not survive fork."""
    if log is not None:
        descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}",
        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30),
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        for name in scenarios:
            started = time.perf_counter()
            try:
                result = SCENARIOS[name](mesh)
            except DistributedMaterializationError as error:
                result = {"state": None, "error": str(error), "failed_ranks": sorted(error.failures)}
            state = result.pop("state")
            if rank == 0 and state is not None:
                torch.save({"state": state, **{k: v for k, v in result.items() if torch.is_tensor(v)}},
                           out / f"{name}.pt")
            info = {k: v for k, v in result.items() if not torch.is_tensor(v)}
            info["seconds"] = time.perf_counter() - started
            (out / f"{name}-rank{rank}.json").write_text(json.dumps(info))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"]),
             Path(sys.argv[1]), sys.argv[2].split(","))
