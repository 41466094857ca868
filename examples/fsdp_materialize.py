"""Build a Llama under deferred_init, shard it with FSDP2, materialize each rank's shards only.

    torchrun --nproc-per-node 2 examples/fsdp_materialize.py          # CPU, gloo
    torchrun --nproc-per-node 2 examples/fsdp_materialize.py --check  # also compare with eager

Every rank builds the whole model as fake tensors (no storage), applies `fully_shard` per decoder
layer and to the root, and materializes: it allocates only its own shards, plus one full tensor
at a time, with the values eager construction from the same seed gives. `--check` gathers the
model and compares it with an eagerly built one, bit for bit (that needs the whole model once).
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from explorer import deferred_init
from explorer.distributed import fully_shard_deferred


def config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the gathered model with eager construction")
    parser.add_argument("--rng", choices=["eager", "fast"], default="eager")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda" if backend == "nccl" else "cpu", (world,))
    try:
        torch.manual_seed(0)
        model = deferred_init(transformers.LlamaForCausalLM, config())  # every rank: fakes only
        full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

        def shard(root: torch.nn.Module) -> None:
            for layer in root.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(root, mesh=mesh)

        fully_shard_deferred(model, mesh, shard=shard, rng=args.rng)
        local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
        print(f"rank {rank}/{world}: holds {local_bytes / 2**20:.1f} MiB of parameters "
              f"of the model's {full_bytes / 2**20:.1f} MiB")

        tokens = torch.arange(32, device=mesh.device_type).reshape(2, 16) % 4096
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()  # a training step works: these are FSDP2's own sharded parameters
        print(f"rank {rank}: loss {loss.item():.6f}")

        if args.check:
            gathered = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu()
                        for k, v in model.state_dict().items()}
            if rank == 0:
                cfg = config()
                torch.manual_seed(0)
                eager = transformers.LlamaForCausalLM(cfg).state_dict()
                same = all(torch.equal(gathered[k], v) for k, v in eager.items())
                print(f"gathered model {'equals' if same else 'DIFFERS from'} eager construction, bit for bit")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
