"""Writing a chunk's blocks into a per-layer pool by block id: one slice copy per run of consecutive ids."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_RUNS = 8  # more runs than this: one index_copy_ beats a Python loop of slice copies


def id_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(source row, destination id, length) for each run of consecutive ids, in order (pure)."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, ids[start], i - start))
            start = i
    return runs


def write_rows(dst: torch.Tensor, ids: Sequence[int], src: torch.Tensor) -> None:
    """dst[ids[i]] = src[i] for every i; converts dtype and device; one copy of the bytes."""
    if len(ids) != src.shape[0]:
        raise ValueError(f"{len(ids)} ids for {src.shape[0]} rows")
    runs = id_runs(ids)
    if len(runs) <= MAX_RUNS:
        for row, dest, n in runs:
            dst[dest : dest + n].copy_(src[row : row + n])
        return
    index = torch.as_tensor(list(ids), dtype=torch.long, device=dst.device)
    dst.index_copy_(0, index, src.to(dst.device, dst.dtype))
