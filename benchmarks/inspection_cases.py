"""Benchmark workloads for the diagrams (explorer.render). Each returns a dict of seconds.

    python -c "import sys; sys.path[:0] = ['.', 'benchmarks']; import inspection_cases as c; print(c.llama_7b_depth2_svg())"
    python -c "import sys; sys.path[:0] = ['.', 'benchmarks']; import inspection_cases as c; print(c.synthetic_focus_view())"

Targets (the lead wires these into run.py): the depth-2 collapsed diagram of Llama-2-7B to SVG in
at most 1 s; a focused view of a 10,000-op graph in at most 2 s. The timed region starts from the
deferred module (building it is deferred_init's benchmark, not this one) and ends with the SVG
text, so it includes the census, the view, the DOT text and Graphviz's layout.

Light at import time, like cases.py: torch, transformers and explorer are imported inside.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=32000)


def _timed(fn: Callable[[], Any], reps: int) -> list[float]:
    fn()  # first call pays lazy imports and caches
    times = []
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def llama_7b_depth2_svg(reps: int = 5) -> dict:
    """Seconds to draw the Llama-2-7B architecture collapsed at depth 2, as SVG (target ≤ 1 s)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from explorer import deferred_init, op_graph
    from explorer.render import to_svg

    model = deferred_init(LlamaForCausalLM, LlamaConfig(**LLAMA_7B))
    svg_bytes = [0]

    def draw() -> None:
        svg_bytes[0] = len(to_svg(op_graph(model, depth=2)))

    times = _timed(draw, reps)
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": times,
            "ops": len(next(iter(_graphs(model))).ops), "svg_bytes": svg_bytes[0]}


def _graphs(model: Any) -> list:
    from explorer.inspection.census import take_census

    return take_census(model).graphs


def synthetic_module_fn(blocks: int = 100, params_per_block: int = 10, ops_per_param: int = 10) -> Any:
    """A module whose constructor issues blocks × params_per_block × ops_per_param small ops (10,000 by
    default): each parameter is created, filled randomly, then scaled and shifted in place a few times."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for index in range(params_per_block):
                weight = torch.empty(4, 4)
                weight.uniform_(-1, 1)
                for step in range(ops_per_param - 2):  # empty + uniform_ + these
                    if step % 2:
                        weight.mul_(0.5)
                    else:
                        weight.add_(0.1)
                self.register_parameter(f"w{index}", nn.Parameter(weight))

    class Synthetic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

    return Synthetic


def synthetic_focus_view(reps: int = 5) -> dict:
    """Seconds to draw one block of a ~10,000-op graph (focus="blocks.50"), as SVG (target ≤ 2 s)."""
    from explorer import deferred_init, op_graph
    from explorer.render import to_svg

    model = deferred_init(synthetic_module_fn())
    ops = len(_graphs(model)[0].ops)

    def draw() -> None:
        to_svg(op_graph(model, focus="blocks.50"))

    times = _timed(draw, reps)
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": times, "ops": ops}


CASES = {"llama_7b_depth2_svg": llama_7b_depth2_svg, "synthetic_focus_view": synthetic_focus_view}
