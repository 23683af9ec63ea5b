"""A peer-sent staging ring name can only reach a segment this worker's kind minted: no paths, no links,
no segments of another size or owner."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tandem.worker.kv_transport.base import KvTransferError
from tandem.worker.kv_transport.staging import (
    CONTROL_BYTES,
    SHM_DIR,
    StagingRing,
    check_segment_name,
    new_segment_name,
    segment_problems,
)


def _victim(tmp_path, capacity: int = 4096):
    """A file outside /dev/shm laid out like a ring, so that the old attach would map it writable."""
    path = tmp_path / "victim"
    data = bytearray(CONTROL_BYTES + capacity)
    np.ndarray((CONTROL_BYTES // 8,), dtype=np.uint64, buffer=data)[2] = capacity
    path.write_bytes(bytes(data))
    return path


def test_minted_names_round_trip():
    name = new_segment_name()
    check_segment_name(name)
    ring = StagingRing.create_shm(1 << 12)
    try:
        peer = StagingRing.attach_shm(ring.name)
        assert peer.capacity == 1 << 12
        peer.close()
    finally:
        ring.close()


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "tandem-kv-../../x",
        "/tandem-kv-" + "0" * 24,
        "tandem-kv-" + "0" * 23,
        "psm_1234",
        "",
    ],
)
def test_unminted_names_are_refused(name):
    with pytest.raises(KvTransferError, match="not a minted"):
        check_segment_name(name)


def test_dotdot_name_never_reaches_the_file(tmp_path):
    victim = _victim(tmp_path)
    before = victim.read_bytes()
    name = os.path.relpath(victim, SHM_DIR)
    assert name.startswith("..")
    with pytest.raises(KvTransferError):
        ring = StagingRing.attach_shm(name)
        ring.region.fill_(0xAB)  # what the old code let a sender do to any file
    assert victim.read_bytes() == before


def test_symlink_with_a_minted_name_is_not_followed(tmp_path):
    victim = _victim(tmp_path)
    before = victim.read_bytes()
    link = os.path.join(SHM_DIR, new_segment_name())
    os.symlink(victim, link)
    try:
        with pytest.raises(OSError):  # ELOOP from O_NOFOLLOW
            ring = StagingRing.attach_shm(os.path.basename(link))
            ring.region.fill_(0xAB)
    finally:
        os.unlink(link)
    assert victim.read_bytes() == before


def test_segment_of_the_wrong_size_is_refused():
    path = os.path.join(SHM_DIR, new_segment_name())
    data = bytearray(CONTROL_BYTES + 100)
    np.ndarray((CONTROL_BYTES // 8,), dtype=np.uint64, buffer=data)[2] = 1 << 20  # claims more than it holds
    with open(path, "wb") as f:
        f.write(data)
    try:
        with pytest.raises(KvTransferError, match="expected"):
            StagingRing.attach_shm(os.path.basename(path))
    finally:
        os.unlink(path)


def test_segment_problems_owner_type_size(tmp_path):
    path = os.path.join(SHM_DIR, new_segment_name())
    with open(path, "wb") as f:
        f.write(bytes(CONTROL_BYTES))
    try:
        st = os.stat(path)
        assert segment_problems(st, CONTROL_BYTES, st.st_uid) == []
        assert any("owned by uid" in p for p in segment_problems(st, CONTROL_BYTES, st.st_uid + 1))
        assert any("expected" in p for p in segment_problems(st, CONTROL_BYTES + 1, st.st_uid))
        assert any("regular file" in p for p in segment_problems(os.stat(tmp_path), None, st.st_uid))
    finally:
        os.unlink(path)


def test_no_data_plane_module_imports_pickle():
    """Peer bytes reach the workers and the router only as protobuf or JSON; pickle would run their code."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "worker"
    users = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in ("pickle", "dill", "cloudpickle") for n in names):
                users.append(str(path.relative_to(root)))
    assert not users, users


def test_cuda_buffer_description_is_checked_before_it_is_opened():
    from tandem.v1 import decode_pb2
    from tandem.worker.kv_transport.cuda_ipc import check_buffer

    good = decode_pb2.CudaIpcBuffer(
        device=0,
        handle=bytes(64),
        storage_size=1 << 20,
        ref_counter_name="/torch_4242_1234567_0",
        event_handle=bytes(64),
    )
    assert check_buffer(good, 1 << 20, local_device=0) == []
    assert check_buffer(good, 1 << 20, local_device=-1)  # this worker's cache is on the CPU
    assert check_buffer(good, 1 << 20, local_device=1)  # another device
    assert check_buffer(good, 1 << 19, local_device=0)  # the control block disagrees on the size
    for bad in ("/../etc/passwd", "/torch_1/../../x", "torch_1", "/psm_1", ""):
        broken = decode_pb2.CudaIpcBuffer()
        broken.CopyFrom(good)
        broken.ref_counter_name = bad
        assert check_buffer(broken, 1 << 20, local_device=0), bad
    empty = decode_pb2.CudaIpcBuffer()
    empty.CopyFrom(good)
    empty.handle = b""
    assert check_buffer(empty, 1 << 20, local_device=0)
