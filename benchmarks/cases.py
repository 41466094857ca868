"""Benchmark workloads. Each runs inside a fresh child process started by `run.py` and returns a dict.

Keep this module light at import time: the heavy imports (torch, transformers, explorer) happen in
the functions, so a child pays them once and the timed regions never do.
"""

from __future__ import annotations

import gc
import hashlib
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

MB = 1024 * 1024

# name -> LlamaConfig keyword arguments. "quick" variants keep the shapes' character, not their size.
CONFIGS: dict[str, dict[str, int]] = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "llama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                       num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "llama-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, vocab_size=32000),
    # the 70B shapes with 4 layers: for profiling layers[0] with its RNG catch-up at 1/20 the cost
    "llama-70b-4l": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=4,
                         num_attention_heads=64, num_key_value_heads=8, vocab_size=32000),
    # a 0.92B-parameter Llama: the checkpoint benchmark's bf16 sharded checkpoint
    "llama-0.9b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=18,
                       num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    # 28 layers of width 64: the op count of Llama-3.2-3B with next to no fill work, so a whole-model
    # materialization measures replay's cost per op (what issue 36's 3B CUDA row is made of)
    "narrow-28l": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=28,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=500),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=100),
    "quick-7b": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=8, vocab_size=4000),
    "quick-1b": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=2, vocab_size=4000),
    "quick-70b": dict(hidden_size=512, intermediate_size=1792, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=4000),
}


def llama_config(name: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**CONFIGS[name])


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def maxrss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples RSS every `interval` seconds on a thread; `peak` is the highest since `reset()`."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def reset(self) -> None:
        with self._lock:
            self.peak = rss_bytes()

    def __enter__(self) -> "RssSampler":
        self.reset()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def _warm_up() -> None:
    """Pay lazy imports and first-call costs of both paths on a tiny model."""
    import torch
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, materialize_module

    tiny = llama_config("tiny")
    with torch.device("meta"):
        LlamaForCausalLM(tiny)
    LlamaForCausalLM(tiny)
    for rng in ("eager", "fast"):
        materialize_module(deferred_init(LlamaForCausalLM, tiny), rng=rng)
    gc.collect()


# -- 1. deferred_init vs meta construction ------------------------------------------------------
def deferred_init_time(config: str, reps: int) -> dict:
    """Interleaved timings of deferred_init and meta-device construction of the same model."""
    import torch
    from transformers import LlamaForCausalLM

    from explorer import deferred_init

    cfg = llama_config(config)
    _warm_up()
    deferred_init(LlamaForCausalLM, cfg)  # one full-size warm-up of each path too
    with torch.device("meta"):
        LlamaForCausalLM(cfg)
    gc.collect()

    def deferred() -> None:
        deferred_init(LlamaForCausalLM, cfg)

    def meta() -> None:
        with torch.device("meta"):
            LlamaForCausalLM(cfg)

    floor_mode = _free_recorder()

    def floor() -> None:
        # What any recorder built on a Python dispatch mode pays even if its handler cost nothing:
        # meta construction, plus the Hugging Face init pass (which meta construction skips and a
        # recording must run), with every op entering a Python handler that does not run the
        # in-place fills.
        with torch.device("meta"), floor_mode():
            LlamaForCausalLM(cfg).initialize_weights()

    floor()
    times: dict[str, list[float]] = {"deferred": [], "meta": [], "floor": []}
    for rep in range(reps):
        order = [("deferred", deferred), ("meta", meta), ("floor", floor)]
        if rep % 2:
            order.reverse()
        for name, fn in order:
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def per_op_time(config: str, reps: int) -> dict:
    """Interleaved timings of eager construction and of deferred_init, then materialize_module, of
    the same model on the CPU; the first rep also checks the values bitwise."""
    import torch
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, materialize_module

    cfg = llama_config(config)
    _warm_up()
    times: dict[str, list[float]] = {"eager": [], "record": [], "materialize": []}
    for rep in range(reps + 1):
        gc.collect()
        torch.manual_seed(rep)
        start = time.perf_counter()
        eager = LlamaForCausalLM(cfg)
        eager_s = time.perf_counter() - start
        gc.collect()
        torch.manual_seed(rep)
        start = time.perf_counter()
        model = deferred_init(LlamaForCausalLM, cfg)
        record_s = time.perf_counter() - start
        start = time.perf_counter()
        materialize_module(model)
        materialize_s = time.perf_counter() - start
        if rep == 0:  # a warm-up rep, checked
            differ = [n for n, t in eager.state_dict().items() if not torch.equal(t, model.state_dict()[n])]
            assert not differ, f"{len(differ)} tensors differ from eager construction: {differ[:4]}"
            continue
        times["eager"].append(eager_s)
        times["record"].append(record_s)
        times["materialize"].append(materialize_s)
    return times


def _free_recorder() -> Any:
    """A TorchDispatchMode class whose handler does the least a recorder could: runs each op on
    meta, and returns in-place random fills and constant fills at once (they only set values)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    values_only = {aten.normal_.default, aten.uniform_.default, aten.fill_.Scalar, aten.zero_.default}

    class FreeRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func in values_only:
                return args[0]
            return func(*args, **(kwargs or {}))

    return FreeRecorder


def deferred_init_rss(config: str) -> dict:
    """RSS growth from holding a deferred model (after a tiny warm-up)."""
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, is_deferred

    cfg = llama_config(config)
    _warm_up()
    before = rss_bytes()
    model = deferred_init(LlamaForCausalLM, cfg)
    gc.collect()
    after = rss_bytes()
    assert is_deferred(model)
    n_params = sum(p.numel() for p in model.parameters())
    return {"growth": after - before, "before": before, "after": after, "params": n_params}


# -- 2. materialization vs eager construction ---------------------------------------------------
CHECK_TENSORS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.{last}.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight",
                 "model.rotary_emb.inv_freq")


def _digests(model: Any, layers: int) -> dict[str, str]:
    import torch

    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    out = {}
    for name in CHECK_TENSORS:
        name = name.format(last=layers - 1)
        tensor = state[name].detach().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy()
        out[name] = f"{tensor.dtype}{list(tensor.shape)}:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
    return out


def materialize_time(config: str, mode: str, verify: bool) -> dict:
    """One timed construction of the model by `mode`; with `verify`, digests of a few tensors."""
    import torch
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, is_deferred, materialize_module

    cfg = llama_config(config)
    _warm_up()
    if mode == "eager":
        torch.manual_seed(0)
        start = time.perf_counter()
        model = LlamaForCausalLM(cfg)
        elapsed = time.perf_counter() - start
    elif mode in ("materialize-eager", "materialize-fast"):
        torch.manual_seed(0)
        model = deferred_init(LlamaForCausalLM, cfg)
        gc.collect()
        start = time.perf_counter()
        materialize_module(model, rng=mode.split("-")[1])
        elapsed = time.perf_counter() - start
        assert not is_deferred(model), "materialize_module left deferred tensors behind"
    elif mode == "meta-to-empty-init":
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
        model.to_empty(device="cpu")
        model.init_weights()  # PreTrainedModel: _init_weights on every module, then tie weights
        elapsed = time.perf_counter() - start
    else:
        raise ValueError(mode)
    result: dict[str, Any] = {"time": elapsed, "peak_rss": maxrss_bytes()}
    if verify:
        result["digests"] = _digests(model, cfg.num_hidden_layers)
    return result


# -- 3. one layer of a huge model ----------------------------------------------------------------
def layer_peak_rss(config: str, rng: str, layer: int = 0) -> dict:
    """deferred_init the whole model, then materialize layers[layer] (negative: from the end); peak
    RSS growth vs layer bytes, and the time materialize_module took."""
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, is_deferred, materialize_module

    cfg = llama_config(config)
    _warm_up()
    with RssSampler() as sampler:
        model = deferred_init(LlamaForCausalLM, cfg)
        index = layer % cfg.num_hidden_layers
        target = model.model.layers[index]
        layer_bytes = sum(t.numel() * t.element_size() for t in (*target.parameters(), *target.buffers()))
        gc.collect()
        deferred_peak = sampler.peak
        before = rss_bytes()
        maxrss_before = maxrss_bytes()
        sampler.reset()
        start = time.perf_counter()
        materialize_module(target, rng=rng)
        elapsed = time.perf_counter() - start
        maxrss_after = maxrss_bytes()
    other = model.model.layers[(index + 1) % cfg.num_hidden_layers]
    assert not is_deferred(target) and is_deferred(other)
    # ru_maxrss is exact for the materialization phase only if nothing before it went higher than
    # the RSS we start from; otherwise it is an upper bound and the sampled peak is used instead.
    maxrss_valid = maxrss_before <= before + 16 * MB
    growth_maxrss = maxrss_after - before
    growth_sampled = sampler.peak - before
    return {
        "layer": index,
        "layer_bytes": layer_bytes,
        "before": before,
        "growth": growth_maxrss if maxrss_valid else growth_sampled,
        "growth_maxrss": growth_maxrss,
        "growth_sampled": growth_sampled,
        "maxrss_valid": maxrss_valid,
        "maxrss_before": maxrss_before,
        "deferred_peak": deferred_peak,
        "time": elapsed,
    }


# -- 4. the generator jump itself ----------------------------------------------------------------
JUMP_DISTANCES = (1, 10**3, 10**6, 10**9, 10**12)


def rng_jump_time(reps: int) -> dict:
    """Seconds to advance the CPU generator state by n draws: the first jump of a fresh process
    (any one-time setup included), then the median of `reps` jumps per distance."""
    import statistics

    import torch

    from explorer.replay.mt19937 import jump_state

    torch.manual_seed(0)
    state = torch.get_rng_state()
    start = time.perf_counter()
    jump_state(state, 10**12 + 12345)
    first = time.perf_counter() - start
    warm: dict[str, float] = {}
    for distance in JUMP_DISTANCES:
        times = []
        for rep in range(reps):
            start = time.perf_counter()
            jump_state(state, distance + rep)
            times.append(time.perf_counter() - start)
        warm[str(distance)] = statistics.median(times)
    return {"first": first, "warm": warm}


# -- 4b. deferred_init of a model initialised by rejection sampling ------------------------------
def trunc_normal_rss(layers: int, width: int) -> dict:
    """RSS growth of deferred_init of `layers` width×width linears initialised by nn.init.trunc_normal_
    (rejection sampling, which reads its draws): recording must stay storage-free."""
    from torch import nn

    from explorer import deferred_init

    class Truncated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            for layer in self.layers:
                nn.init.trunc_normal_(layer.weight, std=0.02)

    deferred_init(Truncated.__base__)  # warm-up: imports and first-call costs
    gc.collect()
    before = rss_bytes()
    with RssSampler() as sampler:
        model = deferred_init(Truncated)
        peak = sampler.peak
    return {"growth": peak - before, "model_bytes": sum(p.numel() * 4 for p in model.parameters())}


# -- 4c. a checkpoint under deferred init --------------------------------------------------------
def make_checkpoint(config: str, directory: str) -> dict:
    """A bf16 sharded `save_pretrained` checkpoint of `config` (made once, then reused)."""
    import torch
    from transformers import LlamaForCausalLM

    if (Path(directory) / "model.safetensors.index.json").is_file():
        return {"made": False}
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    LlamaForCausalLM(llama_config(config)).save_pretrained(directory, max_shard_size="500MB")
    return {"made": True}


def checkpoint_rss(directory: str, layer: int) -> dict:
    """RSS growth of `deferred_init(from_pretrained, bf16 checkpoint, dtype=float32)`, of materializing
    one decoder layer (and whether it equals eager loading), and what is left after release_module."""
    import torch
    from transformers import LlamaForCausalLM

    import explorer

    gc.collect()
    before = rss_bytes()
    with RssSampler() as sampler:
        model = explorer.deferred_init(LlamaForCausalLM.from_pretrained, directory, dtype=torch.float32)
        recorded = sampler.peak
    target = model.model.layers[layer]
    layer_bytes = sum(t.numel() * t.element_size() for t in target.state_dict().values())
    gc.collect()
    before_layer = rss_bytes()
    with RssSampler() as sampler:
        explorer.materialize_module(target)
        materialized = sampler.peak
    digest = hashlib.blake2b(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                                      for t in target.state_dict().values())).hexdigest()
    released = None
    if hasattr(explorer, "release_module"):
        explorer.release_module(target)
        gc.collect()
        released = rss_bytes() - before_layer
    del model, target
    gc.collect()
    eager = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).model.layers[layer]
    expected = hashlib.blake2b(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                                        for t in eager.state_dict().values())).hexdigest()
    return {"record_growth": recorded - before, "layer_growth": materialized - before_layer,
            "layer_bytes": layer_bytes, "equal": digest == expected, "released_left": released}


# -- 5. sharded materialization: each rank draws only its rows -----------------------------------
def _shard_rank(rank: int, world: int, config: str, init_file: str, out: Any) -> None:
    """One gloo rank: deferred_init, then time fully_shard_deferred (each decoder layer, then root)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM

    from explorer import deferred_init
    from explorer.distributed import fully_shard_deferred

    torch.set_num_threads(1)  # a rank owns one core, as it would on a machine with a core per rank
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = deferred_init(LlamaForCausalLM, llama_config(config))

        def shard(root: Any) -> None:
            for layer in root.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(root, mesh=mesh)

        dist.barrier()
        start = time.perf_counter()
        fully_shard_deferred(model, mesh, shard=shard)
        out.put((rank, time.perf_counter() - start))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def shard_time(config: str, world: int) -> dict:
    """Seconds each of `world` gloo ranks takes in fully_shard_deferred of the same model."""
    import tempfile

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        processes = [context.Process(target=_shard_rank, args=(r, world, config, f"{folder}/init", queue))
                     for r in range(world)]
        for process in processes:
            process.start()
        times = dict(queue.get(timeout=1800) for _ in range(world))
        for process in processes:
            process.join()
    if any(p.exitcode != 0 for p in processes):
        raise RuntimeError(f"a rank exited with {[p.exitcode for p in processes]}")
    return {"times": [times[r] for r in range(world)]}


# -- profiles (guidance for engine work, not targets) --------------------------------------------
def _stats_text(profiler: Any, top: int, sort: str = "tottime") -> str:
    import io
    import pstats

    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.strip_dirs().sort_stats(sort).print_stats(top)
    return buffer.getvalue()


class _Timers:
    """Wall-clock time spent inside selected callables, by label (exclusive of nested labels)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[Any]] = []  # [label, start, time spent in nested timed calls]

    def wrap(self, owner: Any, attribute: str, label: Any) -> None:
        """Replace owner.attribute by a timed version; `label` is a string or f(args) -> string."""
        original = getattr(owner, attribute, None)
        if original is None:
            return
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            name = label(args) if callable(label) else label
            frame = [name, time.perf_counter(), 0.0]
            timers._stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                timers._stack.pop()
                elapsed = time.perf_counter() - frame[1]
                timers.totals[name] = timers.totals.get(name, 0.0) + elapsed - frame[2]
                timers.calls[name] = timers.calls.get(name, 0) + 1
                if timers._stack:
                    timers._stack[-1][2] += elapsed

        setattr(owner, attribute, timed)


def _instrument_replay() -> tuple[_Timers, Any]:
    """Timers on the engine's replay: aten calls (split real / RNG catch-up scratch), generator state
    handling, planning and assembly; whatever the wall time leaves over is the engine's own Python."""
    from torch._ops import OpOverload

    from explorer.replay import replay, rng

    timers = _Timers()
    in_scratch = [False]

    def op_label(args: tuple) -> str:
        where = "aten (RNG catch-up scratch)" if in_scratch[0] else "aten"
        return f"{where}: {args[0]}"

    original_scratch = replay.Replay.run_scratch

    def scratch(self: Any, index: int, extra: dict | None = None) -> Any:
        in_scratch[0] = True
        try:
            return original_scratch(self, index, extra)
        finally:
            in_scratch[0] = False

    replay.Replay.run_scratch = scratch
    timers.wrap(OpOverload, "__call__", op_label)
    timers.wrap(rng.RngSession, "before_random_op", "engine: RngSession.before_random_op (generator get/set_state)")
    timers.wrap(rng.RngSession, "after_random_op", "engine: RngSession.after_random_op (generator get_state)")
    timers.wrap(replay.Replay, "run_scratch", "engine: Replay.run_scratch (building scratch tensors)")
    timers.wrap(replay.Replay, "ops_to_run", "engine: Replay.ops_to_run (closure)")
    timers.wrap(replay, "check_replayable", "engine: preflight.check_replayable")
    timers.wrap(replay.Replay, "_assemble", "engine: Replay._assemble")
    return timers, OpOverload


def _breakdown(timers: _Timers, wall: float) -> str:
    rows = sorted(timers.totals.items(), key=lambda item: -item[1])
    accounted = sum(timers.totals.values())
    groups: dict[str, float] = {}
    for name, total in rows:
        group = name.split(":")[0]
        groups[group] = groups.get(group, 0.0) + total
    lines = [f"{'seconds':>9} {'share':>6} {'calls':>6}  where"]
    for group, total in sorted(groups.items(), key=lambda item: -item[1]):
        lines.append(f"{total:9.3f} {100 * total / wall:5.1f}% {'':>6}  {group} (all)")
    lines.append(f"{wall - accounted:9.3f} {100 * (wall - accounted) / wall:5.1f}% {'':>6}  "
                 "engine: everything else (Replay.run/_run_op bookkeeping, tree_map, memo, ...)")
    lines.append("")
    for name, total in rows:
        lines.append(f"{total:9.3f} {100 * total / wall:5.1f}% {timers.calls[name]:6d}  {name}")
    return "\n".join(lines)


def profile_deferred_init(config: str, top: int) -> dict:
    """cProfile of one deferred_init of `config` (after warm-ups), top functions by tottime."""
    import cProfile

    from transformers import LlamaForCausalLM

    from explorer import deferred_init

    cfg = llama_config(config)
    _warm_up()
    deferred_init(LlamaForCausalLM, cfg)
    gc.collect()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    model = deferred_init(LlamaForCausalLM, cfg)
    profiler.disable()
    elapsed = time.perf_counter() - start
    graph = next(model.parameters())._deferred_handle.graph
    text = _stats_text(profiler, top) + "\n" + _stats_text(profiler, top, "cumulative")
    return {"time": elapsed, "ops": len(graph.ops), "tensors": len(graph.tensors), "text": text}


def profile_materialize(config: str, rng: str, target: str, top: int) -> dict:
    """cProfile of materialize_module(`target` of the deferred `config` model, rng=`rng`).

    Also reports how much of the time is inside aten op calls (OpOverload.__call__: kernels plus
    dispatch) and how much is the engine's own Python around them.
    """
    import cProfile

    import torch
    from transformers import LlamaForCausalLM

    from explorer import deferred_init, materialize_module

    cfg = llama_config(config)
    _warm_up()
    torch.manual_seed(0)
    model = deferred_init(LlamaForCausalLM, cfg)
    module = model.get_submodule(target) if target else model
    gc.collect()
    # 1. wall-clock breakdown with light timers (cProfile cannot see inside aten calls reliably)
    timers, _ = _instrument_replay()
    start = time.perf_counter()
    materialize_module(module, rng=rng)
    wall = time.perf_counter() - start
    breakdown = _breakdown(timers, wall)
    # 2. cProfile of the same call on a fresh copy: the engine's Python functions by tottime
    del module, model
    gc.collect()
    torch.manual_seed(0)
    model = deferred_init(LlamaForCausalLM, cfg)
    module = model.get_submodule(target) if target else model
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    materialize_module(module, rng=rng)
    profiler.disable()
    text = _stats_text(profiler, top)
    return {"time": wall, "breakdown": breakdown, "text": text}


CASES = {
    "profile_deferred_init": profile_deferred_init,
    "profile_materialize": profile_materialize,
    "deferred_init_time": deferred_init_time,
    "deferred_init_rss": deferred_init_rss,
    "per_op_time": per_op_time,
    "materialize_time": materialize_time,
    "layer_peak_rss": layer_peak_rss,
    "rng_jump_time": rng_jump_time,
    "shard_time": shard_time,
    "trunc_normal_rss": trunc_normal_rss,
    "make_checkpoint": make_checkpoint,
    "checkpoint_rss": checkpoint_rss,
}
