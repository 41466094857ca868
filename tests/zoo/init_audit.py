"""Zoo init audit: which timm models and transformers architectures leave tensors uninitialized.

For each model, in a forked child with a time limit (as tests/zoo/coverage.py lists and runs them):

1. build it under `deferred_init` from seed 0 and run `explorer.init_report(model, reinit=fn)`, with
   the model's own re-init function `fn` as a meta-device user would call it after `to_empty()`:
   transformers `model.init_weights()`; timm `model.init_weights()` where the model has one, else
   `reset_parameters()` on every submodule that has it;
2. verify every claim independently, without the recording (models up to `VERIFY_BYTES`):
   - "uninitialized": eager construction twice, in fresh processes whose freed heap memory was
     filled with 0xA5, then with 0x5A bytes (mmap disabled, so the constructor's allocations reuse
     that memory); the claim is confirmed when the tensor's bytes differ between the two;
   - "uninitialized after reinit": the same twice with meta construction + `to_empty()` + `fn`:
     confirmed when the bytes differ between the two runs, or when both differ from eager
     construction's (a few-byte tensor may get the same stale bytes twice: allocator bins that the
     fill did not reach; it is still not what construction gave);
   - "reinit differs": meta + `to_empty()` + `fn` against eager construction: confirmed when
     the values' mean or standard deviation disagree beyond sampling error (`init_measure.disagrees`).

Writes `build/zoo/init_results.jsonl` and `build/zoo/init_report.md` (confirmed findings with tensor
names, then unconfirmed claims: each one a false positive of the audit to look at).

    python -m tests.zoo.init_audit --only timm --match 'swin|maxvit|eva02' --jobs 1
    python -m tests.zoo.init_audit --only hf-tiny          # tests/support/hf_configs.py's architectures
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from explorer import deferred_init, init_report
from explorer.analysis.init_measure import Measured, disagrees, measure
from tests.support.torchvision_hook import declare_torchvision_ops
from tests.zoo.coverage import ZOO_SOURCES, ZooEntry, add_listing_arguments, failure_kind, zoo_entries

VERIFY_BYTES = 384 << 20  # models larger than this are audited, not verified
TIME_LIMIT_S = 240
OUT = Path("build/zoo")
PATTERNS = (0xA5, 0x5A)
# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


@dataclass
class AuditRow:
    source: str
    name: str
    status: str  # audited | verified | too-large | failed | timeout | crashed
    reinit: str = ""  # the re-init function used
    tensors: int = 0
    bytes: int = 0
    claims: dict = field(default_factory=dict)  # flag → names the audit flags
    confirmed: dict = field(default_factory=dict)  # flag → names the independent check confirms
    kind: str = ""
    message: str = ""


def _tiny_apertus() -> nn.Module:
    import transformers as T

    return T.ApertusModel(
        T.ApertusConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )


def _tiny_altclip() -> nn.Module:
    import transformers as T

    text = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        project_dim=16,
        max_position_embeddings=64,
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    return T.AltCLIPModel(T.AltCLIPConfig(text_config=text, vision_config=vision, projection_dim=16))


def _tiny_clip() -> nn.Module:
    import transformers as T

    text = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    return T.CLIPModel(T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))


# Architectures whose default configs are too large to verify and whose audit flags something:
# tiny configs of the same classes, so the claims can be checked against eager construction.
TINY_EXTRA = {
    "apertus:ApertusModel": _tiny_apertus,
    "altclip:AltCLIPModel": _tiny_altclip,
    "clip:CLIPModel": _tiny_clip,
}


def hf_tiny_builders() -> list[ZooEntry]:
    """tests/support/hf_configs.py's tiny architectures (each builds in milliseconds), and `TINY_EXTRA`."""
    from tests.support.hf_configs import HF_ARCHITECTURES

    def builder(arch) -> Callable[[], nn.Module]:
        return lambda: arch.cls(arch.config())

    return [("hf-tiny", f"{arch.name}:{arch.cls.__name__}", builder(arch)) for arch in HF_ARCHITECTURES] + [
        ("hf-tiny", name, build) for name, build in TINY_EXTRA.items()
    ]


def reinit_function(source: str, model: nn.Module) -> tuple[str, Callable[[nn.Module], object]]:
    """The re-init a meta-device user of this library calls after `to_empty()`, and its name."""
    if source in ("transformers", "hf-tiny") and hasattr(model, "init_weights"):
        return "model.init_weights()", lambda m: m.init_weights()
    if callable(getattr(model, "init_weights", None)):
        return "model.init_weights()", lambda m: m.init_weights()

    def reset_every_submodule(m: nn.Module) -> None:
        for sub in m.modules():
            if callable(getattr(sub, "reset_parameters", None)):
                sub.reset_parameters()

    return "reset_parameters() on every submodule", reset_every_submodule


# -- independent checks --------------------------------------------------------------------------


def _dirty_heap(pattern: int, nbytes: int) -> None:
    """Fill memory with `pattern`, then free it for the next allocations to reuse (no mmap)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    small = [
        torch.full((size,), pattern, dtype=torch.uint8) for size in (1, 4, 8, 16, 32, 64, 128, 256, 1024, 4096) * 2000
    ]
    block = torch.full((nbytes,), pattern, dtype=torch.uint8)
    del small, block


def _bytes_of(model: nn.Module, names: list[str]) -> dict[str, bytes]:
    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    return {
        name: tensors[name].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for name in names
        if name in tensors
    }


def _in_fresh_process(work: Callable[[], dict]) -> dict:
    """Run `work` in a forked child (its own heap), return its dict (or {"error": ...})."""
    context = mp.get_context("fork")
    parent, child = context.Pipe(duplex=False)

    def target() -> None:
        try:
            child.send(work())
        except BaseException as error:  # any failure goes back to the parent as {"error": ...}
            child.send({"error": f"{type(error).__name__}: {error}"})

    process = context.Process(target=target, daemon=False)
    process.start()
    child.close()
    result = parent.recv() if parent.poll(TIME_LIMIT_S) else {"error": "timeout"}
    process.join(timeout=10)
    return result


def eager_bytes(build: Callable[[], nn.Module], names: list[str], pattern: int, heap: int) -> dict:
    def work() -> dict:
        _dirty_heap(pattern, heap)
        torch.manual_seed(0)
        return _bytes_of(build(), names)

    return _in_fresh_process(work)


def reinit_run(
    build: Callable[[], nn.Module], source: str, names: list[str], pattern: int, heap: int, stats: bool
) -> dict:
    """Meta construction, `to_empty()` onto pattern-dirtied memory, then the re-init: each name's
    bytes (or, with `stats`, its measured moments)."""

    def work() -> dict:
        torch.manual_seed(0)
        with torch.device("meta"):
            model = build()
        _dirty_heap(pattern, heap)
        model.to_empty(device="cpu")
        reinit_function(source, model)[1](model)
        if not stats:
            return _bytes_of(model, names)
        tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(
            model.named_buffers(remove_duplicate=False)
        )
        return {name: tuple(measure(tensors[name])) for name in names if name in tensors}

    return _in_fresh_process(work)


def eager_stats(build: Callable[[], nn.Module], names: list[str]) -> dict:
    def work() -> dict:
        torch.manual_seed(0)
        model = build()
        tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(
            model.named_buffers(remove_duplicate=False)
        )
        return {
            name: (
                tuple(measure(tensors[name])),
                tensors[name].numel(),
                str(tensors[name].dtype).removeprefix("torch."),
            )
            for name in names
            if name in tensors
        }

    return _in_fresh_process(work)


def _differing(first: dict, second: dict) -> list[str]:
    return sorted(name for name in first if name in second and first[name] != second[name])


def verify(row: AuditRow, build: Callable[[], nn.Module]) -> None:
    """Fill `row.confirmed` from independent eager / meta runs (see the module docstring)."""
    heap = max(2 * row.bytes, 64 << 20)
    claims = row.claims
    if claims.get("uninitialized"):
        runs = [eager_bytes(build, claims["uninitialized"], pattern, heap) for pattern in PATTERNS]
        row.confirmed["uninitialized"] = [] if any("error" in r for r in runs) else _differing(*runs)
    if claims.get("uninitialized after reinit"):
        names = claims["uninitialized after reinit"]
        runs = [reinit_run(build, row.source, names, p, heap, False) for p in PATTERNS]
        eager = eager_bytes(build, names, 0, heap)
        if any("error" in r for r in (*runs, eager)):
            row.confirmed["uninitialized after reinit"] = []
        else:  # garbage that changes with the memory, or stable garbage that is not eager's value
            unlike_eager = set(_differing(runs[0], eager)) & set(_differing(runs[1], eager))
            row.confirmed["uninitialized after reinit"] = sorted(set(_differing(*runs)) | unlike_eager)
    if claims.get("reinit differs"):
        names = claims["reinit differs"]
        reinit, eager = reinit_run(build, row.source, names, PATTERNS[0], heap, True), eager_stats(build, names)
        confirmed = []
        if "error" not in reinit and "error" not in eager:
            for name, (moments, count, dtype) in eager.items():
                got = reinit.get(name)
                expected = Measured(*moments)
                if (
                    got is not None
                    and (got != moments)
                    and disagrees(Measured(*got), expected.mean, expected.std, count, True, getattr(torch, dtype))
                ):
                    confirmed.append(name)
        row.confirmed["reinit differs"] = sorted(confirmed)


# -- one model -----------------------------------------------------------------------------------

AUDITED_FLAGS = ("uninitialized", "uninitialized after reinit", "reinit differs")


def audit_one(source: str, name: str, build: Callable[[], nn.Module]) -> AuditRow:
    torch.set_num_threads(1)
    row = AuditRow(source, name, "failed")
    try:
        torch.manual_seed(0)
        model = deferred_init(build)
        row.reinit, fn = reinit_function(source, model)
        table = init_report(model, reinit=fn)
    except Exception as error:  # every failure is a row
        row.kind, row.message = failure_kind(error), traceback.format_exc()[-1500:]
        return row
    row.tensors = len(table)
    row.bytes = int(table.drop_duplicates("name")["numel"].sum() * 4)
    for flag in AUDITED_FLAGS:
        names = table.loc[table["flags"].map(lambda flags, flag=flag: flag in flags), "name"].tolist()
        if names:
            row.claims[flag] = names
    row.status = "audited"
    del model, table
    if not row.claims:
        row.status = "verified"
        return row
    if row.bytes > VERIFY_BYTES:
        row.status = "too-large"
        return row
    try:
        verify(row, build)
        row.status = "verified"
    except Exception as error:  # every failure is a row
        row.kind, row.message = failure_kind(error), traceback.format_exc()[-1500:]
    return row


def _child(conn, source: str, name: str, build: Callable[[], nn.Module]) -> None:
    try:
        row = audit_one(source, name, build)
    except BaseException as error:  # the runner itself failed: still a row
        row = AuditRow(source, name, "crashed", kind=failure_kind(error), message=traceback.format_exc()[-1500:])
    conn.send(asdict(row))
    conn.close()


def run_all(entries: list, jobs: int, out: Path) -> list[AuditRow]:
    """Each model in its own forked child, `jobs` at a time, rows appended to init_results.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    results = out / "init_results.jsonl"
    done: dict[tuple[str, str], AuditRow] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            row = AuditRow(**json.loads(line))
            done[(row.source, row.name)] = row
    pending = [entry for entry in entries if (entry[0], entry[1]) not in done]
    context = mp.get_context("fork")
    running: list = []
    with results.open("a") as sink:
        while pending or running:
            while pending and len(running) < jobs:
                source, name, build = pending.pop(0)
                parent, child = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(child, source, name, build))
                process.start()
                child.close()
                running.append((process, parent, (source, name), time.monotonic()))
            time.sleep(0.05)
            for entry in list(running):
                process, parent, (source, name), started = entry
                row = None
                if parent.poll():
                    try:
                        row = AuditRow(**parent.recv())
                    except EOFError:
                        row = AuditRow(source, name, "crashed", kind="crashed", message=f"exit code {process.exitcode}")
                elif not process.is_alive():
                    row = AuditRow(source, name, "crashed", kind="crashed", message=f"exit code {process.exitcode}")
                elif time.monotonic() - started > 4 * TIME_LIMIT_S:
                    process.kill()
                    row = AuditRow(source, name, "timeout", kind="timeout")
                if row is None:
                    continue
                process.join(timeout=5)
                running.remove(entry)
                done[(source, name)] = row
                sink.write(json.dumps(asdict(row)) + "\n")
                sink.flush()
                found = {flag: len(names) for flag, names in row.confirmed.items() if names}
                print(
                    f"{row.status:>10}  {source}:{name}  claims={ {f: len(n) for f, n in row.claims.items()} } "
                    f"confirmed={found} {row.kind}",
                    flush=True,
                )
    return [done[(s, n)] for s, n, _ in entries if (s, n) in done]


def report(rows: list[AuditRow]) -> str:
    """Markdown: counts, confirmed findings (model, re-init, tensors), then unconfirmed claims."""
    lines = [
        f"{len(rows)} models: "
        + ", ".join(
            f"{sum(r.status == s for r in rows)} {s}"
            for s in ("verified", "too-large", "failed", "timeout", "crashed")
            if any(r.status == s for r in rows)
        ),
        "",
    ]
    for flag in AUDITED_FLAGS:
        lines += [f"### {flag}: confirmed", ""]
        found = [(r, r.confirmed.get(flag, [])) for r in rows if r.confirmed.get(flag)]
        lines += [
            f"- `{r.source}:{r.name}` ({r.reinit if 'reinit' in flag else 'eager construction'}): "
            + ", ".join(f"`{n}`" for n in names[:12])
            + (f" (+{len(names) - 12})" if len(names) > 12 else "")
            for r, names in found
        ] or ["- none"]
        lines.append("")
        unconfirmed = [
            (r, sorted(set(r.claims.get(flag, [])) - set(r.confirmed.get(flag, []))))
            for r in rows
            if r.status == "verified"
        ]
        unconfirmed = [(r, names) for r, names in unconfirmed if names]
        if unconfirmed:
            lines += [f"{flag}, claimed but not confirmed:", ""]
            lines += [f"- `{r.source}:{r.name}`: " + ", ".join(f"`{n}`" for n in names[:8]) for r, names in unconfirmed]
            lines.append("")
    failed = [r for r in rows if r.status in ("failed", "timeout", "crashed")]
    if failed:
        lines += ["### not audited", ""] + [f"- `{r.source}:{r.name}`: {r.kind}" for r in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    extra_sources = {"hf-tiny": hf_tiny_builders}  # only when named: `--only hf-tiny`
    add_listing_arguments(parser, {**ZOO_SOURCES, **extra_sources})
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    declare_torchvision_ops()
    entries = zoo_entries(args.only, args.limit, args.match, extra_sources)
    rows = run_all(entries, args.jobs, args.out)
    text = report(rows)
    (args.out / "init_report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
