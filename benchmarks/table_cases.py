"""Benchmark of `explorer.inspect`: the four tables of a full-size architecture built under deferred_init.

Target: at most 0.5 s for Llama-2-7B (32 layers, 32000 vocab) after one warm-up call. Run alone:

    python benchmarks/table_cases.py [--config llama-7b] [--reps 5]

or from a harness, as `CASES["inspect_time"](config=..., reps=...)` in a fresh process (like the
cases in `cases.py`). Light at import: torch, transformers and the engine load inside the function.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
INSPECT_TARGET_S = 0.5


def inspect_time(config: str = "llama-7b", reps: int = 5) -> dict:
    """Seconds per `explorer.inspect(model)` of a deferred Llama (median of `reps` after a warm-up).

    The garbage collector is left on while timing (a user pays for it too) but collected before each
    call, so one call does not pay for another's garbage.
    """
    from cases import llama_config  # light: no torch at import
    from transformers import LlamaForCausalLM

    import explorer
    from explorer import deferred_init, inspect

    model = deferred_init(LlamaForCausalLM, llama_config(config))
    tables = inspect(model)  # warm-up: first-call costs (pandas, linecache) are not the tables'
    times = []
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        tables = inspect(model)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "config": config,
        "engine": str(Path(explorer.__file__).parent),
        "times": times,
        "median": median,
        "max": max(times),
        "target": INSPECT_TARGET_S,
        "pass": median <= INSPECT_TARGET_S,
        "rows": {name: len(getattr(tables, name)) for name in ("tensors", "modules", "ops", "storages")},
        "parameters": int(tables.modules["total_params"].iloc[0]),
    }


CASES = {"inspect_time": inspect_time}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="llama-7b")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(HERE)]  # this checkout's engine, not an installed one
    result = inspect_time(args.config, args.reps)
    print(json.dumps(result, indent=2))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
