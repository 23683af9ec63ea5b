"""Worker selection: prefill (and colocated) by queued prompt tokens then streams, decode by room and running
sequences, never an unhealthy or draining one."""

import pytest

from tandem.worker.router.selection import WorkerView, pick_decode, pick_prefill


def test_prefill_goes_to_the_shortest_queue_and_skips_bad_workers():
    ws = [
        WorkerView("a", queued_prompt_tokens=900),
        WorkerView("b", queued_prompt_tokens=100, inflight_prompt_tokens=500),
        WorkerView("c", queued_prompt_tokens=0, healthy=False),
        WorkerView("d", queued_prompt_tokens=0, draining=True),
    ]
    assert pick_prefill(ws).address == "b"
    assert pick_prefill(ws, exclude={"b"}).address == "a"
    assert pick_prefill(ws[2:]) is None


def test_of_equal_queues_a_prompt_goes_where_it_stalls_the_fewest_streams():
    streaming = WorkerView("a", inflight_requests=2, last_picked=0.0)  # picked longest ago, but decoding two
    quiet = WorkerView("b", inflight_requests=0, last_picked=5.0)
    assert pick_prefill([streaming, quiet]).address == "b"
    quiet.queued_prompt_tokens = 1  # a prompt ahead outranks the streams: its wait is the first token's
    assert pick_prefill([streaming, quiet]).address == "a"


def test_decode_needs_room_then_prefers_fewer_running():
    ws = [
        WorkerView("a", running_sequences=1, free_kv_blocks=3, total_kv_blocks=100),
        WorkerView("b", running_sequences=5, free_kv_blocks=80, total_kv_blocks=100),
        WorkerView("c", running_sequences=5, free_kv_blocks=90, total_kv_blocks=100),
    ]
    assert pick_decode(ws, blocks_needed=2).address == "a"
    assert pick_decode(ws, blocks_needed=10).address == "c"
    # when nobody has room, still pick someone (the worker queues or preempts) rather than fail
    assert pick_decode(ws, blocks_needed=1000).address == "a"
    assert pick_decode([WorkerView("x", draining=True)], 1) is None


def test_equally_loaded_workers_take_turns_not_the_lowest_address_every_time():
    """One request at a time never loads a worker, so the tie-break decides: the one picked longest ago."""
    decode = [WorkerView(a, free_kv_blocks=50, total_kv_blocks=50) for a in ("a", "b")]
    prefill = [WorkerView(a) for a in ("a", "b")]
    for pick, views in ((lambda: pick_decode(decode, 1), decode), (lambda: pick_prefill(prefill), prefill)):
        chosen = []
        for now in range(1, 5):
            view = pick()
            view.last_picked = float(now)  # what the router stamps on the worker it chose
            chosen.append(view.address)
        assert chosen == ["a", "b", "a", "b"]
        views[0].running_sequences = views[0].queued_prompt_tokens = 3  # load still outranks the turn
        assert pick().address == "b" and pick().address == "b"


def test_headless_service_names_resolve_to_one_address_per_pod():
    from tandem.worker.router.membership import DiscoveryError, resolve

    assert resolve("10.0.0.7:50051") == ["10.0.0.7:50051"]
    assert resolve("dns:///localhost:50051") in (
        ["127.0.0.1:50051"],
        ["127.0.0.1:50051", "[::1]:50051"],
        ["[::1]:50051"],
    )
    with pytest.raises(DiscoveryError):
        resolve("dns:///localhost:not-a-port")
