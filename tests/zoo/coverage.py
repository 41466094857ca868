"""`make zoo`: build every timm model and every transformers architecture under `deferred_init`.

For each model, in a forked child process with a time limit (a crash or a hang costs one row):

1. build it under `deferred_init` from seed 0 (timm: `create_model(name, pretrained=False)`;
   transformers: the `MODEL_MAPPING_NAMES` class on its default config);
2. small models (at most `PARITY_BYTES` of parameters and buffers) are materialized whole and
   compared bit for bit with eager construction from the same seed; larger ones materialize one
   submodule (the largest child that fits `SUBMODULE_BYTES`) and check it holds no fake;
3. before step 2, FSDP2's dim-0 shard of rank 1 of 4 of every tensor step 2 materializes is
   made alone where `slice_plan` says it can be (`materialize_tensor(t[a:b])`); after step 2 each
   must equal the same rows of the materialized tensor bit for bit (and so eager's, for the whole
   models), and step 2's parity shows the slices left the replay undisturbed;
4. when step 1 fails, the model is built on the `meta` device to tell "the constructor fails
   anyway" (not ours to fix) from "fails only deferred" (a bug here).

Writes `build/zoo/results.jsonl` (one row per model) and `build/zoo/report.md` (counts by source
and status, failures grouped by kind). `python -m tests.zoo.coverage --only timm --limit 50` runs
part of it; `--jobs` sets the parallelism (default: the CPU count).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from explorer import (  # imported once, before the forks
    WholeBaseWarning,
    deferred_init,
    is_fake,
    materialize_module,
    materialize_tensor,
    slice_plan,
)
from tests.support.torchvision_hook import declare_torchvision_ops

PARITY_BYTES = 256 << 20
SUBMODULE_BYTES = 512 << 20
TIME_LIMIT_S = 300
OUT = Path("build/zoo")


@dataclass
class ZooRow:
    source: str  # timm | transformers
    name: str
    status: str  # parity | materialized | fails-on-meta | failed | timeout | crashed
    kind: str = ""  # failure kind: the exception type and its first words
    message: str = ""
    bytes: int = 0
    tensors: int = 0
    record_s: float = 0.0
    materialized: str = ""  # which submodule ("" = the whole model)
    detail: dict = field(default_factory=dict)


ZooEntry = tuple[str, str, Callable[[], nn.Module]]  # (source, model name, build it from seed 0)


def timm_builders() -> list[ZooEntry]:
    import timm

    def builder(name: str) -> Callable[[], nn.Module]:
        return lambda: timm.create_model(name, pretrained=False)

    return [("timm", name, builder(name)) for name in timm.list_models()]


def transformers_builders() -> list[ZooEntry]:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    def builder(model_type: str, class_name: str) -> Callable[[], nn.Module]:
        def build() -> nn.Module:
            return getattr(transformers, class_name)(CONFIG_MAPPING[model_type]())

        return build

    rows = []
    for model_type, class_names in MODEL_MAPPING_NAMES.items():
        class_name = class_names if isinstance(class_names, str) else class_names[0]
        rows.append(("transformers", f"{model_type}:{class_name}", builder(model_type, class_name)))
    return rows


# Every zoo run (this one, tests/zoo/init_audit.py) lists its models here: source → its listing.
ZOO_SOURCES: dict[str, Callable[[], list[ZooEntry]]] = {"timm": timm_builders, "transformers": transformers_builders}


def add_listing_arguments(parser: argparse.ArgumentParser, sources: dict[str, Callable[[], list[ZooEntry]]]) -> None:
    """`--only` (one of `sources`), `--limit` and `--match`: what `zoo_entries` takes."""
    parser.add_argument("--only", choices=list(sources), default=None)
    parser.add_argument("--limit", type=int, default=0, help="first N models of each source")
    parser.add_argument("--match", default="", help="regex on model names")


def zoo_entries(
    only: str | None, limit: int, match: str, extra_sources: dict[str, Callable[[], list[ZooEntry]]] | None = None
) -> list[ZooEntry]:
    """The (source, name, build) entries a zoo run builds: the source `only` names, or with None
    every source of `ZOO_SOURCES` in order (an `extra_sources` one runs only when named); the first
    `limit` of each source (0: all); then those whose name the regex `match` finds ("" : all)."""
    listings = {**ZOO_SOURCES, **(extra_sources or {})}
    entries = [entry for source in ([only] if only else ZOO_SOURCES) for entry in listings[source]()[: limit or None]]
    if match:
        entries = [entry for entry in entries if re.search(match, entry[1])]
    return entries


def failure_kind(error: BaseException) -> str:
    """A short, stable label for grouping: exception type plus the message's first clause."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    first = re.sub(r"0x[0-9a-f]+|\d+", "N", first)
    first = re.split(r"[:(\[]", first, maxsplit=1)[0].strip()
    return f"{type(error).__name__}: {first[:80]}"


def _storage_bytes(module: nn.Module) -> tuple[int, int]:
    seen: dict[int, int] = {}
    count = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        count += 1
        seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values()), count


def _submodule_to_materialize(module: nn.Module) -> tuple[str, nn.Module]:
    """The largest named submodule (children first, then deeper) whose tensors fit SUBMODULE_BYTES."""
    best = ("", None, -1)
    for name, sub in module.named_modules():
        if not name:
            continue
        size, count = _storage_bytes(sub)
        if count and size <= SUBMODULE_BYTES and size > best[2]:
            best = (name, sub, size)
    if best[1] is None:
        return "", module
    return best[0], best[1]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _tensors_by_name(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` by name, tied names included."""
    return dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))


def _parity(deferred: nn.Module, build: Callable[[], nn.Module]) -> str:
    """ "" when every parameter and buffer equals eager construction bit for bit, else the first mismatch."""
    torch.manual_seed(0)
    eager = build()
    got = _tensors_by_name(deferred)
    want = _tensors_by_name(eager)
    if got.keys() != want.keys():
        return f"names differ: {sorted(got.keys() ^ want.keys())[:3]}"
    for name, tensor in want.items():
        if not _same_bits(got[name], tensor):
            return f"{name}: values differ"
        if got[name].stride() != tensor.stride():
            return f"{name}: stride {got[name].stride()} != {tensor.stride()}"
    return ""


def _shard_rows(tensor: torch.Tensor) -> slice | None:
    """Rank 1 of 4's rows of `tensor` as FSDP2 shards dim 0 (None: a scalar, or no rows there)."""
    if tensor.dim() == 0:
        return None
    per_rank = -(-tensor.shape[0] // 4)
    rows = slice(per_rank, min(2 * per_rank, tensor.shape[0]))
    return rows if rows.start < rows.stop else None


def _rows_made_alone(module: nn.Module) -> tuple[dict[str, tuple[slice, torch.Tensor]], Counter]:
    """Each tensor's rank-1 rows that `slice_plan` says are made alone, made so (name → (rows,
    tensor)); and the count of every view by what `slice_plan` said ("alone" or the reason)."""
    made, said = {}, Counter()
    named = _tensors_by_name(module)
    for name, tensor in named.items():
        rows = _shard_rows(tensor)
        if rows is None:
            continue
        plan = slice_plan(tensor[rows])
        said["alone" if plan.sliced else (plan.reason or "ordinary view")] += 1
        if plan.sliced:
            made[name] = (rows, materialize_tensor(tensor[rows]))
    return made, said


def _rows_mismatch(module: nn.Module, made: dict[str, tuple[slice, torch.Tensor]]) -> str:
    """ "" when every row set made alone equals the same rows of `module`'s materialized tensors."""
    named = _tensors_by_name(module)
    for name, (rows, alone) in made.items():
        if not _same_bits(alone, named[name][rows]):
            return f"{name}[{rows.start}:{rows.stop}] made alone differs from the whole tensor's rows"
    return ""


def run_one(source: str, name: str, build: Callable[[], nn.Module]) -> ZooRow:
    torch.set_num_threads(1)
    row = ZooRow(source, name, "failed")
    try:
        torch.manual_seed(0)
        start = time.perf_counter()
        module = deferred_init(build)
        row.record_s = round(time.perf_counter() - start, 3)
    except Exception as error:  # every failure is a row
        row.kind, row.message = failure_kind(error), str(error)[:2000]
        row.detail["traceback"] = traceback.format_exc()[-3000:]
        try:
            with torch.device("meta"):
                build()
        except Exception as meta_error:  # failing on meta too is the finding
            row.status = "fails-on-meta"
            row.kind = failure_kind(meta_error)
        return row
    row.bytes, row.tensors = _storage_bytes(module)
    try:
        whole = row.bytes <= PARITY_BYTES
        if not whole:
            row.materialized, sub = _submodule_to_materialize(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WholeBaseWarning)
            made, said = _rows_made_alone(module if whole else sub)
        row.detail["rows"] = dict(said)
        if whole:
            materialize_module(module)
            mismatch = _parity(module, build) or _rows_mismatch(module, made)
            if mismatch:
                row.kind, row.message = "parity", mismatch
                return row
            row.status = "parity"
        else:
            materialize_module(sub)
            mismatch = _rows_mismatch(sub, made)
            if mismatch:
                row.kind, row.message = "parity", mismatch
                return row
            fakes = [n for n, t in list(sub.named_parameters()) + list(sub.named_buffers()) if is_fake(t)]
            if fakes:
                row.kind, row.message = "still fake", ", ".join(fakes[:5])
                return row
            row.status = "materialized"
    except Exception as error:  # every failure is a row
        row.kind, row.message = failure_kind(error), str(error)[:2000]
        row.detail["traceback"] = traceback.format_exc()[-3000:]
    return row


def _child(conn, source: str, name: str, build: Callable[[], nn.Module]) -> None:
    try:
        row = run_one(source, name, build)
    except BaseException as error:  # the runner itself failed: still a row
        row = ZooRow(source, name, "crashed", kind=failure_kind(error), message=traceback.format_exc()[-2000:])
    conn.send(asdict(row))
    conn.close()


def run_all(entries: list[ZooEntry], jobs: int, out: Path) -> list[ZooRow]:
    """Each entry in its own forked child, `jobs` at a time; rows are appended to results.jsonl as they end."""
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = {}
    if results.exists():  # resume: rows already written are kept
        for line in results.read_text().splitlines():
            row = json.loads(line)
            done[(row["source"], row["name"])] = ZooRow(**row)
    pending = [e for e in entries if (e[0], e[1]) not in done]
    context = mp.get_context("fork")
    running: list[tuple[mp.Process, object, tuple, float]] = []
    with results.open("a") as sink:
        while pending or running:
            while pending and len(running) < jobs:
                source, name, build = pending.pop(0)
                parent, child = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(child, source, name, build), daemon=True)
                process.start()
                child.close()
                running.append((process, parent, (source, name), time.monotonic()))
            time.sleep(0.05)
            for entry in list(running):
                process, parent, (source, name), started = entry
                row = None
                if parent.poll():
                    try:
                        row = ZooRow(**parent.recv())
                    except EOFError:
                        row = ZooRow(source, name, "crashed", kind="crashed", message=f"exit code {process.exitcode}")
                elif not process.is_alive():
                    row = ZooRow(source, name, "crashed", kind="crashed", message=f"exit code {process.exitcode}")
                elif time.monotonic() - started > TIME_LIMIT_S:
                    process.kill()
                    row = ZooRow(source, name, "timeout", kind="timeout", message=f"over {TIME_LIMIT_S} s")
                if row is None:
                    continue
                process.join(timeout=5)
                running.remove(entry)
                done[(source, name)] = row
                sink.write(json.dumps(asdict(row)) + "\n")
                sink.flush()
                print(f"{row.status:>14}  {source}:{name}  {row.kind}", flush=True)
    return [done[(s, n)] for s, n, _ in entries if (s, n) in done]


def timm_families() -> dict[str, str]:
    """timm model name → the timm module (family) that defines it."""
    import timm

    return {name: module for module in timm.list_modules() for name in timm.list_models(module=module)}


def report(rows: list[ZooRow], families: dict[str, str] | None = None) -> str:
    """Markdown: counts by source and status, then by timm family (when `families` maps timm model
    names to their module), then failures grouped by kind with their models."""
    statuses = ["parity", "materialized", "fails-on-meta", "failed", "timeout", "crashed"]
    lines = ["| source | models | " + " | ".join(statuses) + " |", "|---" * (len(statuses) + 2) + "|"]
    by_source = defaultdict(Counter)
    for row in rows:
        by_source[row.source][row.status] += 1
    for source, counts in sorted(by_source.items()):
        cells = " | ".join(str(counts.get(s, 0)) for s in statuses)
        lines.append(f"| {source} | {sum(counts.values())} | {cells} |")
    if families:
        by_family = defaultdict(Counter)
        for row in rows:
            if row.source == "timm":
                by_family[families.get(row.name, "?")][row.status] += 1
        lines += [
            "",
            "### timm by family",
            "",
            "| family | models | " + " | ".join(statuses) + " |",
            "|---" * (len(statuses) + 2) + "|",
        ]
        for family, counts in sorted(by_family.items()):
            cells = " | ".join(str(counts.get(s, 0)) for s in statuses)
            lines.append(f"| {family} | {sum(counts.values())} | {cells} |")
    lines += _rows_report(rows)
    for status in ("failed", "timeout", "crashed", "fails-on-meta"):
        groups = defaultdict(list)
        for row in rows:
            if row.status == status:
                groups[row.kind].append(row)
        if not groups:
            continue
        lines += ["", f"### {status}", ""]
        for kind, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            names = ", ".join(f"{m.source}:{m.name}" for m in members[:12])
            more = f" (+{len(members) - 12})" if len(members) > 12 else ""
            lines.append(f"- **{len(members)}** `{kind}`: {names}{more}")
    return "\n".join(lines) + "\n"


def _rows_report(rows: list[ZooRow]) -> list[str]:
    """Markdown lines: how many rank-1 shards each source's models made alone, and the reasons the
    others were not (the ten most common)."""
    said: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        said[row.source].update(row.detail.get("rows", {}))
    if not said:
        return []
    lines = ["", "### rank 1 of 4's rows, made alone", "", "| source | views | made alone |", "|---|---:|---:|"]
    for source, counts in sorted(said.items()):
        lines.append(f"| {source} | {sum(counts.values())} | {counts['alone']} |")
    reasons = sum(said.values(), Counter())
    del reasons["alone"]
    lines += ["", "Why the others were not:", ""]
    lines += [f"- {count}: {reason}" for reason, count in reasons.most_common(10)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_listing_arguments(parser, ZOO_SOURCES)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    declare_torchvision_ops()
    entries = zoo_entries(args.only, args.limit, args.match)
    rows = run_all(entries, args.jobs, args.out)
    text = report(rows, timm_families() if args.only in (None, "timm") else None)
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
