"""`save_checkpoint` of a model opened from a Hub, measured in a process of its own: the peak
resident memory it adds. The Hub runs in the parent (its buffers are not counted here).

    python -m tests.support.hub_save_probe REPO OUT DTYPE   # DTYPE: "none" or "float32"

The environment names the endpoint and the caches (HF_ENDPOINT, HF_HOME, EXPLORER_HUB_CACHE).
Prints one JSON line: `peak_growth` (bytes of peak RSS over the RSS before the save; Linux's
VmHWM, reset just before it), `saved_bytes` (tensor bytes written), `largest` (the largest tensor
written, in bytes), `cache_bytes` (bytes the save left in the Hub range cache), `seconds`."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _cache_bytes() -> int:
    root = Path(os.environ["EXPLORER_HUB_CACHE"]) / "ranges"
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def main(repo: str, out: str, dtype_name: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    import explorer
    from explorer.replay.save_safetensors import stored_once

    dtype = None if dtype_name == "none" else getattr(torch, dtype_name)
    opening = time.perf_counter()
    model = explorer.deferred_init(AutoModelForCausalLM.from_pretrained, repo)
    opened = time.perf_counter() - opening
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the RSS now
    before = _status("VmRSS")
    started = time.perf_counter()
    explorer.save_checkpoint(model, out, dtype=dtype, progress=False)
    seconds = time.perf_counter() - started
    peak = _status("VmHWM")
    state = stored_once(model.state_dict(keep_vars=True))
    sizes = [
        t.numel() * (dtype.itemsize if dtype and t.is_floating_point() else t.element_size()) for t in state.values()
    ]
    return {
        "peak_growth": peak - before,
        "saved_bytes": sum(sizes),
        "largest": max(sizes),
        "cache_bytes": _cache_bytes(),
        "seconds": seconds,
        "open_seconds": opened,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
