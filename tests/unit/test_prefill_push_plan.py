"""Which blocks a prefill chunk may push: only blocks whose KV is final, the partial tail only at the end."""

from tandem.worker.serve.prefill import PUSH_GRACE_S, PUSH_TIMEOUT_CAP_S, blocks_to_push, push_timeout_s


def test_full_blocks_go_as_chunks_finish_and_the_tail_goes_last():
    # 40-token prompt, blocks of 16, chunks of 20 tokens; the decode worker holds no prefix
    assert blocks_to_push(20, 40, 16, next_block=0) == (0, 1)  # block 1 is half written
    assert blocks_to_push(40, 40, 16, next_block=1) == (1, 3)  # the rest, incl. the partial block 2
    # a chunk that completes nothing new pushes nothing
    assert blocks_to_push(24, 40, 16, next_block=1) == (1, 1)


def test_blocks_the_decode_worker_already_has_are_skipped():
    # the decode side had 2 blocks by prefix: pushing starts at block 2 even if prefill recomputed them
    assert blocks_to_push(48, 50, 16, next_block=2) == (2, 3)
    assert blocks_to_push(50, 50, 16, next_block=3) == (3, 4)


def test_a_push_gives_up_when_the_decode_lease_runs_out():
    now = 1_000_000.0
    assert push_timeout_s(int((now + 2.0) * 1000), now) == 2.0 + PUSH_GRACE_S
    assert push_timeout_s(int((now - 5.0) * 1000), now) == PUSH_GRACE_S  # already expired (or a skewed clock)
    assert push_timeout_s(int((now + 3600) * 1000), now) == PUSH_TIMEOUT_CAP_S
    assert push_timeout_s(0, now) == PUSH_TIMEOUT_CAP_S  # no lease in the reservation
