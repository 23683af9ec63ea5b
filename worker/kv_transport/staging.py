"""A single-producer, single-consumer staging ring a decode worker lends to one transfer at a time.

The data region is a uint8 tensor (shared memory on the CPU, or a CUDA buffer shared by IPC); a small
shared-memory control block holds the consumer's read position and the epoch of the transfer the ring
is lent to. The producer writes a chunk, then sends its header (offset, length) on the gRPC stream;
the consumer copies the chunk into the KV cache and advances the read position.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory

import numpy as np
import torch

from tandem.shm_segments import SEGMENT_NAME, SEGMENT_PREFIX, SHM_DIR, new_segment_name
from tandem.v1 import decode_pb2

from .base import KvTransferError

CONTROL_BYTES = 64  # u64 slots: read_pos, epoch, capacity
_READ, _EPOCH, _CAPACITY = 0, 1, 2


def ring_start(write_pos: int, length: int, capacity: int) -> int:
    """Logical offset where a chunk of `length` goes so that it does not wrap around the ring (pure)."""
    if length > capacity:
        raise ValueError(f"chunk of {length} bytes exceeds the ring's {capacity}")
    if write_pos % capacity + length <= capacity:
        return write_pos
    return (write_pos // capacity + 1) * capacity


def check_segment_name(name: str) -> None:
    """Refuse any name this worker's kind could not have minted (a path, `..`, another process's segment)."""
    if not SEGMENT_NAME.fullmatch(name):
        raise KvTransferError(
            f"staging segment name {name[:80]!r} is not a minted {SEGMENT_PREFIX}<pid>-<hex> token"
        )


def segment_problems(st: os.stat_result, expected_size: int | None, uid: int) -> list[str]:
    """Why an opened segment must not be mapped (pure): not a regular file, not ours, or the wrong size."""
    problems = []
    if not stat.S_ISREG(st.st_mode):
        problems.append("not a regular file")
    if st.st_uid != uid:
        problems.append(f"owned by uid {st.st_uid}, not {uid}")
    if st.st_size < CONTROL_BYTES:
        problems.append(f"{st.st_size} bytes, smaller than the control block")
    elif expected_size is not None and st.st_size != expected_size:
        problems.append(f"{st.st_size} bytes, expected {expected_size}")
    return problems


def _create(size: int) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=new_segment_name(), create=True, size=size)


class _Attached:
    """A segment another process created, mapped from /dev/shm without multiprocessing's resource tracker
    (which, on Python 3.11, would unlink it when this process exits). The name comes from a peer: only a
    minted token is accepted, opened without following links, and mapped only if it is a regular file of
    this user."""

    def __init__(self, name: str, size: Callable[[memoryview], int] | None = None):
        check_segment_name(name)
        self.name = name
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            problems = segment_problems(st, None, os.getuid())
            if problems:
                raise KvTransferError(f"staging segment {name} refused: {'; '.join(problems)}")
            self._map = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)
        if size is not None and (want := size(self.buf)) != st.st_size:
            self.close()
            raise KvTransferError(f"staging segment {name} refused: {st.st_size} bytes, expected {want}")

    def close(self) -> None:
        self.buf.release()
        try:
            self._map.close()
        except BufferError:  # tensors still view the mapping; it goes when they do
            pass

    def unlink(self) -> None:
        raise PermissionError("only the creator of a staging segment removes it")


def _capacity(buf: memoryview) -> int:
    return int(np.ndarray((CONTROL_BYTES // 8,), dtype=np.uint64, buffer=buf)[_CAPACITY])


class StagingRing:
    def __init__(self, control: shared_memory.SharedMemory | _Attached, region: torch.Tensor, owner: bool):
        self._control_seg = control
        self._control = np.ndarray((CONTROL_BYTES // 8,), dtype=np.uint64, buffer=control.buf)
        self.region = region
        self.owner = owner
        self.write_pos = 0  # producer side only

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def create_shm(cls, capacity: int) -> StagingRing:
        """Control block and data region in one shared-memory segment (decode side)."""
        seg = _create(CONTROL_BYTES + capacity)
        region = torch.frombuffer(seg.buf, dtype=torch.uint8, offset=CONTROL_BYTES, count=capacity)
        region.fill_(0)  # fault the pages in now, not during the first transfer
        ring = cls(seg, region, owner=True)
        ring._control[_CAPACITY] = capacity
        return ring

    @classmethod
    def attach_shm(cls, name: str) -> StagingRing:
        """The producer's view of a decode worker's ring, by the name it sent (checked, see _Attached)."""
        seg = _Attached(name, size=lambda buf: CONTROL_BYTES + _capacity(buf))
        capacity = _capacity(seg.buf)
        region = torch.frombuffer(seg.buf, dtype=torch.uint8, offset=CONTROL_BYTES, count=capacity)
        return cls(seg, region, owner=False)

    @classmethod
    def with_region(cls, region: torch.Tensor) -> StagingRing:
        """A ring over a given region (e.g. a CUDA buffer) with its control block in a new segment."""
        seg = _create(CONTROL_BYTES)
        ring = cls(seg, region, owner=True)
        ring._control[_CAPACITY] = region.numel()
        return ring

    @classmethod
    def attach_control(cls, name: str, region: torch.Tensor) -> StagingRing:
        return cls(_Attached(name, size=lambda buf: CONTROL_BYTES), region, owner=False)

    @property
    def name(self) -> str:
        return self._control_seg.name

    @property
    def capacity(self) -> int:
        return int(self._control[_CAPACITY])

    def close(self) -> None:
        """Detach; the owner also removes the segment."""
        self.region = torch.empty(0, dtype=torch.uint8)
        self._control = np.zeros(CONTROL_BYTES // 8, dtype=np.uint64)
        self._control_seg.close()
        if self.owner:
            self._control_seg.unlink()

    # -- lending (consumer side) ----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._control[_EPOCH])

    def lend(self, epoch: int) -> None:
        """Start a transfer: positions back to zero, owned by `epoch`."""
        self._control[_READ] = 0
        self._control[_EPOCH] = epoch

    def revoke(self) -> None:
        self._control[_EPOCH] = 0

    # -- producer ----------------------------------------------------------------------------------
    def write(
        self,
        parts: Sequence[torch.Tensor],
        epoch: int,
        deadline: float,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> decode_pb2.StagingSlice:
        """Copy uint8 tensors into the ring, back to back, waiting for space; returns where they went."""
        length = sum(p.numel() for p in parts)
        start = ring_start(self.write_pos, length, self.capacity)
        pause = 20e-6
        while start + length - int(self._control[_READ]) > self.capacity:
            if cancelled():
                raise KvTransferError("transfer cancelled while waiting for staging space")
            if time.monotonic() > deadline:
                raise KvTransferError("timed out waiting for the decode worker to drain the staging ring")
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
        if int(self._control[_EPOCH]) != epoch:
            raise KvTransferError(f"staging ring no longer lent to epoch {epoch}")
        pos = start % self.capacity
        for p in parts:
            self.region[pos : pos + p.numel()].copy_(p)
            pos += p.numel()
        if self.region.is_cuda:
            torch.cuda.current_stream(self.region.device).synchronize()
        self.write_pos = start + length
        return decode_pb2.StagingSlice(offset=start, length=length)

    # -- consumer ----------------------------------------------------------------------------------
    def view(self, where: decode_pb2.StagingSlice) -> torch.Tensor:
        pos = where.offset % self.capacity
        if pos + where.length > self.capacity:
            raise KvTransferError("staging slice wraps around the ring")
        return self.region[pos : pos + where.length]

    def release(self, where: decode_pb2.StagingSlice) -> None:
        """The consumer is done with everything up to the end of `where`."""
        self._control[_READ] = where.offset + where.length


class StagingPool:
    """Rings a decode worker lends, one per transfer; none free means the transfer falls back to gRPC."""

    def __init__(self, rings: Sequence[StagingRing]):
        self._free = list(rings)
        self._all = list(rings)
        self._lock = threading.Lock()

    def lend(self, epoch: int) -> StagingRing | None:
        with self._lock:
            if not self._free:
                return None
            ring = self._free.pop()
        ring.lend(epoch)
        return ring

    def give_back(self, ring: StagingRing) -> None:
        ring.revoke()
        with self._lock:
            if ring not in self._free:
                self._free.append(ring)

    @property
    def free(self) -> int:
        return len(self._free)

    def close(self) -> None:
        for ring in self._all:
            ring.close()
        self._free.clear()
