"""Step inputs built with tensor ops equal the per-token definition (positions and cache slots)."""

from __future__ import annotations

import torch

from tandem.worker.engine.layers.attention import block_table_tensor
from tandem.worker.engine.runner.step_inputs import slot_mapping, token_positions


def test_positions_and_slots_equal_the_per_token_loop():
    bs = 4
    cached, query_lens = [0, 9, 3, 17], [6, 1, 5, 1]
    tables = [[7, 2], [0, 5, 9], [3, 8], [1, 4, 6, 10, 11]]
    want_seq, want_pos, want_slots = [], [], []
    for i, (start, n) in enumerate(zip(cached, query_lens, strict=True)):
        for p in range(start, start + n):
            want_seq.append(i)
            want_pos.append(p)
            want_slots.append(tables[i][p // bs] * bs + p % bs)
    table = block_table_tensor(tables, [c + n for c, n in zip(cached, query_lens, strict=True)], bs)
    seq, pos = token_positions(torch.tensor(cached), torch.tensor(query_lens))
    assert seq.tolist() == want_seq and pos.tolist() == want_pos
    assert slot_mapping(table, seq, pos, bs).tolist() == want_slots


def test_block_table_is_padded_to_the_longest_context():
    table = block_table_tensor([[4, 5, 6], [9]], [9, 2], block_size=4)
    assert table.tolist() == [[4, 5, 6], [9, 0, 0]]
