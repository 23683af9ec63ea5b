"""A worker's tensor-parallel ranks as one process group: rank 0 is the worker process itself and starts ranks
1..N-1 as child processes (`python -m tandem.worker.engine.tp.follower`), so a pod or `tandem up` needs
nothing more than the one command line.

Rendezvous is a TCP store on loopback at a port the kernel picks; the ranks' collectives run over NCCL on
GPUs and gloo on the CPU; commands (pickled, small) go from rank 0 to the others over a gloo group of their
own. A rank that loses rank 0 (its parent process is gone) exits.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

START_TIMEOUT = datetime.timedelta(seconds=300)  # every rank has joined the store by then
IDLE_TIMEOUT = datetime.timedelta(days=365)  # followers wait this long for rank 0's next command
FOLLOWER_MODULE = "tandem.worker.engine.tp.follower"

Command = tuple[Any, ...]  # (kind, *arguments): see follower.py for each kind


def rank_device(device: str | torch.device, rank: int) -> torch.device:
    """Rank `rank`'s device: the rank-th GPU counting from rank 0's, or the CPU."""
    base = torch.device(device)
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


@dataclass
class TpGroup:
    rank: int
    ranks: int
    device: torch.device
    control: Any  # the gloo group commands travel on
    followers: list[subprocess.Popen] = field(default_factory=list)  # rank 0: the processes it started

    # --- commands (rank 0 sends, the others receive) ----------------------------------------------
    def send(self, command: Command) -> None:
        dist.broadcast_object_list([command], src=0, group=self.control)

    def receive(self) -> Command:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    # --- collectives the model runs ----------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial output (row-parallel layers)."""
        dist.all_reduce(x)
        return x

    def gather_last(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """Every rank's slice joined along the last dimension, cut to `size` (vocab-parallel logits)."""
        parts = [torch.empty_like(x) for _ in range(self.ranks)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)[..., :size]

    def gather_heads(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: every rank's KV blocks joined along the head dimension; the others: None."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.ranks)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=2) if parts is not None else None

    def scatter_heads(self, x: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """This rank's share (along the head dimension) of rank 0's full KV blocks `x`, shaped like `like`."""
        out = torch.empty_like(like)
        parts = None
        if self.rank == 0:
            assert x is not None
            parts = [p.contiguous() for p in x.to(self.device, like.dtype).chunk(self.ranks, dim=2)]
        dist.scatter(out, parts, src=0)
        return out

    def stop(self) -> None:
        """Rank 0: tell the others to exit, wait for them, and leave the group."""
        if self.rank == 0:
            try:
                self.send(("stop",))
            except Exception:  # noqa: BLE001 (a follower already gone: nothing to tell)
                pass
            for p in self.followers:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        dist.destroy_process_group()


def _join(store: dist.Store, rank: int, ranks: int, device: torch.device) -> TpGroup:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=ranks, timeout=IDLE_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if backend != "gloo" else dist.group.WORLD
    return TpGroup(rank, ranks, device, control)


def _loopback_env() -> None:
    if sys.platform.startswith("linux"):
        os.environ.setdefault(
            "GLOO_SOCKET_IFNAME", "lo"
        )  # the ranks share one host: never a pod's other NICs
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def start_ranks(ranks: int, device: str | torch.device, threads: int | None = None) -> TpGroup:
    """Rank 0 (this process): start ranks 1..N-1 and join them in one process group."""
    _loopback_env()
    store = dist.TCPStore(
        "127.0.0.1", 0, ranks, is_master=True, timeout=START_TIMEOUT, wait_for_workers=False
    )
    followers = []
    for rank in range(1, ranks):
        argv = [
            sys.executable,
            "-P",
            "-m",
            FOLLOWER_MODULE,
            "--rank",
            str(rank),
            "--ranks",
            str(ranks),
            "--port",
            str(store.port),
            "--device",
            str(rank_device(device, rank)),
        ]
        if threads:
            argv += ["--threads", str(threads)]
        followers.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
    group = _join(store, 0, ranks, rank_device(device, 0))
    group.followers = followers
    return group


def join_ranks(rank: int, ranks: int, port: int, device: str | torch.device) -> TpGroup:
    """A follower (this process): join rank 0's group; exit when rank 0's process is gone."""
    _loopback_env()
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=orphaned, name="tp-parent", daemon=True).start()
    store = dist.TCPStore("127.0.0.1", port, ranks, is_master=False, timeout=START_TIMEOUT)
    return _join(store, rank, ranks, torch.device(device))
