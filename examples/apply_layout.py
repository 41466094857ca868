"""Apply a parallel layout for real on CPU ranks, run one training step, print each rank's peak.

    python examples/apply_layout.py                               # FSDP 2 × TP 1: 2 ranks
    python examples/apply_layout.py --dp-shard 2 --tp 2 --ac block  # 4 ranks
    python examples/apply_layout.py --tp 2 --print-source         # also show the generated code

The layout becomes Python source (`explorer.analysis.layout_export.to_python`), which every rank
executes: `build_mesh("cpu")`, then `apply_layout` as the `shard=` step of
`explorer.distributed.fully_shard_deferred`. So the small Llama is built under `deferred_init`
(fake tensors), tensor-parallelized, checkpoint-wrapped and FSDP2-sharded while its parameters
are still on the meta device, and each rank materializes only its own shards (values equal to
eager construction from the same seed). One training step runs under PyTorch's `MemTracker`.

Every rank feeds the same batch, so every rank must print the same loss, equal (up to reduction
order) to one unsharded process's: a check that the layout did not change the math. The ranks are
forked on 127.0.0.1 with gloo; pipeline parallelism is not run here (its split is model-specific).
"""

from __future__ import annotations

import argparse
import datetime
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers
from torch.distributed._tools.mem_tracker import MemTracker

from explorer import deferred_init
from explorer.analysis.layout_export import to_python
from explorer.analysis.parallel_layout import Layout
from explorer.distributed import fully_shard_deferred

SEED = 0
SEQUENCE = 16


def config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def tp_plan() -> dict[str, str]:
    """transformers' own plan for Llama's blocks, with paths from the LlamaForCausalLM root."""
    return {f"model.{key}": style for key, style in config().base_model_tp_plan.items()}


def batch(layout: Layout) -> torch.Tensor:
    """The token ids every rank feeds (the same on each: see the module docstring)."""
    generator = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, config().vocab_size, (layout.micro_batch_size, SEQUENCE), generator=generator)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def run_rank(rank: int, world: int, port: int, layout: Layout, source: str) -> None:
    """One rank (the target of a forked process): apply the layout, step once, print loss and peak."""
    torch.set_num_threads(1)  # OpenMP pools do not survive fork; the ranks share the cores anyway
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        generated: dict = {}
        exec(compile(source, "<apply_layout>", "exec"), generated)  # the text to_python wrote
        mesh = generated["build_mesh"]("cpu")
        torch.manual_seed(SEED)
        model = deferred_init(transformers.LlamaForCausalLM, config())
        fully_shard_deferred(model, mesh, shard=lambda root: generated["apply_layout"](root, mesh))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            loss = train_step(model, optimizer, batch(layout))
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        sys.stdout.write(f"rank {rank}: loss {loss!r} peak_bytes {peak}\n")  # one write: lines stay whole
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def parse_layout(argv: list[str] | None = None) -> tuple[Layout, bool]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp-shard", type=int, default=2, help="FSDP2 shard degree")
    parser.add_argument("--dp-replicate", type=int, default=1, help="replicas of the shard group (HSDP)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--ac", choices=["none", "block", "selective"], default="none", help="activation checkpointing")
    parser.add_argument("--micro-batch-size", type=int, default=2, help="sequences per rank")
    parser.add_argument("--print-source", action="store_true", help="print the code to_python generated")
    args = parser.parse_args(argv)
    layout = Layout(
        dp_shard=args.dp_shard,
        dp_replicate=args.dp_replicate,
        tp=args.tp,
        activation_checkpointing=args.ac,
        micro_batch_size=args.micro_batch_size,
    )
    return layout, args.print_source


def main(argv: list[str] | None = None) -> None:
    layout, print_source = parse_layout(argv)
    source = to_python(layout, tp_plan=tp_plan() if layout.tp > 1 else None)
    if print_source:
        print(source)
    print(f"{layout.label()}: {layout.gpus} ranks", flush=True)
    mp.start_processes(
        run_rank, args=(layout.gpus, free_port(), layout, source), nprocs=layout.gpus, start_method="fork"
    )


if __name__ == "__main__":
    main()
