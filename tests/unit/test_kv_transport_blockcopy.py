"""Block writes by id: runs of consecutive ids, and the same result as indexed assignment either way."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.kv.layout import MAX_RUNS, id_runs, write_rows


def test_runs_of_consecutive_ids():
    assert id_runs([]) == []
    assert id_runs([4]) == [(0, 4, 1)]
    assert id_runs([3, 4, 5, 9, 10, 2]) == [(0, 3, 3), (3, 9, 2), (5, 2, 1)]


@pytest.mark.parametrize(
    "ids", [[5, 6, 7], [7, 3], list(range(20, 0, -2)), [1, 2, 3] + list(range(30, 30 - 2 * MAX_RUNS, -2))]
)
def test_write_rows_equals_indexed_assignment_with_dtype_conversion(ids):
    src = torch.randn(len(ids), 4, 3)
    ours, ref = torch.zeros(40, 4, 3, dtype=torch.bfloat16), torch.zeros(40, 4, 3, dtype=torch.bfloat16)
    write_rows(ours, ids, src)
    ref[torch.tensor(ids)] = src.bfloat16()
    assert torch.equal(ours, ref)


def test_write_rows_rejects_a_count_mismatch():
    with pytest.raises(ValueError):
        write_rows(torch.zeros(4, 2), [0, 1], torch.zeros(3, 2))
