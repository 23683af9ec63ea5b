"""Decode attention alone, each backend side by side on one paged cache: step time and % of the copy floor.

One decode step's attention over every layer of a model's shape, for a batch of rows that each hold
`context` tokens in scattered pages of 16, in bf16 (and with the 8-bit cache where a backend reads it):

- general path: `attend` on a fresh `AttentionBatch` per step (its host layout included), eager, for
  `sdpa` (gathers each context), `flex` (compiled FlexAttention in place) and `triton` (our kernel in place);
- static step: `static_decode_attention` as the captured decode step runs it (the new key beside the cache),
  `sdpa` and `triton`, captured as one CUDA graph for all layers and replayed (CUDA only).

The floor is the KV bytes the step must read over the copy bandwidth this run measures (a device-to-device
copy, bytes read plus written per second). Which backend the engine defaults to waits on these figures.

    python -m bench.attention_backends [--shape llama-3.1-8b] [--out attention.json]
    python -m bench.attention_backends --dry-run  # CPU, a tiny shape (triton only under TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tandem.worker.engine.layers.attention import AttentionBatch, attend
from tandem.worker.engine.layers.kv_int8 import pack
from tandem.worker.engine.layers.static_decode import StaticDecodeBatch, static_decode_attention

PAGE = 16
BACKENDS = ("sdpa", "flex", "triton")
STATIC_BACKENDS = ("sdpa", "triton")  # the backends the static decode step runs


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int


SHAPES = {
    "llama-3.2-1b": Shape(16, 32, 8, 64),
    "llama-3.1-8b": Shape(32, 32, 8, 128),
    "tiny": Shape(2, 8, 2, 16),  # the dry run
}


@dataclass(frozen=True)
class Row:
    """One backend at one (batch, context, cache) point."""

    shape: str
    path: str  # general | static
    backend: str
    kv_cache: str  # auto | int8
    batch: int
    context: int
    step_ms: float
    floor_ms: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.step_ms


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes read plus written per second by a device-to-device copy (median of 10)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, repeats=10)
    return 2 * nbytes / seconds


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warm_up: int = 3) -> float:
    for _ in range(warm_up):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class PagedPoint:
    """A batch's caches (one pool per layer), page tables and one step's queries, on the device."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    tables: list[list[int]]
    q: torch.Tensor  # [B, NH, D]
    k_new: torch.Tensor  # [B, KVH, D]
    v_new: torch.Tensor
    kv_bytes: int  # what one step must read


def paged_point(
    shape: Shape, batch: int, context: int, kv_cache: str, device: torch.device, seed: int = 0
) -> PagedPoint:
    """Random caches whose rows own scattered pages (the new token's key is the context's last)."""
    g = torch.Generator().manual_seed(seed)
    need = -(-context // PAGE)
    pool = batch * need + 1
    order = torch.randperm(pool, generator=g).tolist()
    tables = [order[i * need : (i + 1) * need] for i in range(batch)]
    dims = (pool, PAGE, shape.kv_heads, shape.head_dim)
    k, v = [], []
    for _ in range(shape.layers):
        for caches in (k, v):
            x = torch.empty(dims, dtype=torch.bfloat16, device=device).normal_()
            caches.append(pack(x) if kv_cache == "int8" else x)
    row = k[0][0, 0, 0].numel() * k[0].element_size()  # bytes of one token's one head
    q = torch.randn(batch, shape.heads, shape.head_dim, dtype=torch.bfloat16, device=device)
    k_new = torch.randn(batch, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16, device=device)
    kv_bytes = 2 * shape.layers * batch * context * shape.kv_heads * row
    return PagedPoint(k, v, tables, q, k_new, torch.randn_like(k_new), kv_bytes)


def general_step(point: PagedPoint, backend: str, context: int) -> Callable[[], object]:
    """One eager step: the batch's layout built as the engine builds it, then every layer's `attend`."""
    device, batch = point.q.device, point.q.shape[0]
    slots = torch.tensor(
        [t[(context - 1) // PAGE] * PAGE + (context - 1) % PAGE for t in point.tables], device=device
    )
    scale = point.q.shape[-1] ** -0.5

    def step() -> None:
        layout = AttentionBatch([1] * batch, [context] * batch, point.tables, slots, PAGE, backend)
        for k, v in zip(point.k, point.v, strict=True):
            attend(point.q, point.k_new, point.v_new, k, v, layout, scale)

    return step


def static_step(point: PagedPoint, backend: str, context: int) -> Callable[[], object]:
    """Every layer's `static_decode_attention` (its table padded to a power of two), captured as one CUDA
    graph."""
    device, batch = point.q.device, point.q.shape[0]
    width = 1 << (-(-context // PAGE) - 1).bit_length()
    table = torch.tensor([t + [t[0]] * (width - len(t)) for t in point.tables], device=device)
    lens = torch.full((batch,), context, dtype=torch.long, device=device)
    layout = StaticDecodeBatch(
        torch.zeros(batch, dtype=torch.long, device=device), table, lens, PAGE, backend
    )
    scale = point.q.shape[-1] ** -0.5

    def step() -> None:
        for k, v in zip(point.k, point.v, strict=True):
            static_decode_attention(point.q, point.k_new, point.v_new, k, v, layout, scale)

    if device.type != "cuda":
        return step
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()  # compile the kernels before capture
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


STEPS = {"general": general_step, "static": static_step}


def triton_runs(device: torch.device) -> str | None:
    """None when the triton backend runs here, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    from tandem.worker.engine.layers.triton_paged import interpreted

    if device.type != "cuda" and not interpreted():
        return "triton needs CUDA here (TRITON_INTERPRET=1 runs it on the CPU)"
    return None


def measure(
    shape_name: str,
    batches: list[int],
    contexts: list[int],
    backends: list[str],
    kv_caches: list[str],
    device: torch.device,
    bandwidth: float,
    repeats: int,
) -> list[Row]:
    shape = SHAPES[shape_name]
    skip = triton_runs(device)
    if skip and "triton" in backends:
        print(f"attention: triton rows skipped: {skip}", flush=True)
        backends = [b for b in backends if b != "triton"]
    rows = []
    for kv_cache in kv_caches:
        for context in contexts:
            for batch in batches:
                point = paged_point(shape, batch, context, kv_cache, device)
                floor_ms = 1e3 * point.kv_bytes / bandwidth
                runs = [
                    ("general", b) for b in backends if not (kv_cache == "int8" and b == "flex")
                ]  # flex: no 8-bit
                runs += [("static", b) for b in backends if b in STATIC_BACKENDS]
                for path, backend in runs:
                    seconds = median_seconds(STEPS[path](point, backend, context), device, repeats)
                    rows.append(
                        Row(shape_name, path, backend, kv_cache, batch, context, 1e3 * seconds, floor_ms)
                    )
                    print(
                        f"attention {path} {backend} {kv_cache} batch {batch} context {context}: "
                        f"{1e3 * seconds:.3f} ms, {rows[-1].percent_of_floor:.0f}% of the floor",
                        flush=True,
                    )
                del point
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def print_table(rows: list[Row], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    columns = sorted({(r.path, r.backend) for r in rows}, key=lambda c: (c[0], BACKENDS.index(c[1])))
    table = Table(title="decode attention, every layer, one step: ms (% of the copy floor)", caption=caption)
    for name in ("shape", "kv cache", "batch", "context", "floor ms"):
        table.add_column(name)
    for path, backend in columns:
        table.add_column(f"{backend} ({path})")
    points = sorted(
        {(r.shape, r.kv_cache, r.batch, r.context) for r in rows}, key=lambda p: (p[0], p[1], p[3], p[2])
    )
    for p in points:
        cells = {(r.path, r.backend): r for r in rows if (r.shape, r.kv_cache, r.batch, r.context) == p}
        floor = next(iter(cells.values())).floor_ms
        out = [
            f"{c.step_ms:.3f} ({c.percent_of_floor:.0f}%)" if (c := cells.get(col)) else "-"
            for col in columns
        ]
        table.add_row(p[0], p[1], str(p[2]), str(p[3]), f"{floor:.3f}", *out)
    Console(width=200).print(table)  # a pipe would otherwise cut the cells to 80 columns


def as_json(rows: list[Row], bandwidth: float) -> dict:
    return {
        "copy_bandwidth_bytes_per_s": bandwidth,
        "rows": [{**asdict(r), "percent_of_floor": r.percent_of_floor} for r in rows],
    }


def run(args: argparse.Namespace, device: torch.device) -> tuple[list[Row], float]:
    bandwidth = copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (1 << 24))
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + written)", flush=True)
    torch._dynamo.config.recompile_limit = (
        64  # flex compiles once per (batch, context) point: keep every one compiled
    )
    rows = []
    for shape in args.shapes:
        rows += measure(
            shape, args.batches, args.contexts, args.backends, args.kv_caches, device, bandwidth, args.repeats
        )
    return rows, bandwidth


def add_arguments(p: argparse.ArgumentParser, shapes: str = "llama-3.2-1b,llama-3.1-8b") -> None:
    p.add_argument(
        "--attention-shapes",
        dest="shapes",
        default=shapes,
        help=f"model shapes of the attention rows ({', '.join(SHAPES)})",
    )
    p.add_argument("--attention-batches", dest="batches", default="1,16,64")
    p.add_argument("--attention-contexts", dest="contexts", default="512,4096")
    p.add_argument("--attention-backends", dest="backends", default=",".join(BACKENDS))
    p.add_argument("--attention-kv-caches", dest="kv_caches", default="auto,int8")


def finish_arguments(args: argparse.Namespace, dry_run: bool) -> None:
    """Split the lists; the dry run measures a tiny shape at tiny sizes."""
    if dry_run:
        args.shapes, args.batches, args.contexts = "tiny", "1,4", "24,40"
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.backends = [b for b in args.backends.split(",") if b]
    args.kv_caches = [k for k in args.kv_caches.split(",") if k]
    unknown = (set(args.shapes) - set(SHAPES)) | (set(args.backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"unknown attention shapes or backends {sorted(unknown)}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--dry-run", action="store_true", help="the CPU at a tiny shape: checks the code, not the GPU"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = p.parse_args(argv)
    finish_arguments(args, args.dry_run)
    if args.dry_run:
        args.repeats = 2
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print(
            "bench/attention_backends.py needs a CUDA GPU; --dry-run runs the code on the CPU",
            file=sys.stderr,
        )
        return 2
    rows, bandwidth = run(args, device)
    caption = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
        if device.type == "cuda"
        else "dry run on the CPU, tiny shape: not a measurement"
    )
    print_table(rows, caption)
    if args.out is not None:
        args.out.write_text(json.dumps({"caption": caption, **as_json(rows, bandwidth)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
