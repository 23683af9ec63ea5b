"""The step's logits-row layout: one row per sampling sequence plus one per draft; sampled drafts are left
out."""

from tandem.worker.engine.runner.sample_rows import per_drawn, sample_rows


def test_without_drafts_every_sequence_owns_one_row_and_is_drawn():
    layout = sample_rows([0, 0, 0], [True, False, True])
    assert layout.firsts == (0, 1, 2) and layout.num_rows == 3
    assert layout.drawn == (0, 1, 2) and layout.drawn_rows == [0, 1, 2]


def test_sampled_drafts_are_left_to_rejection_sampling():
    # greedy with 2 drafts (rows 0-2), sampled with 1 draft (rows 3-4), sampled without drafts (row 5)
    layout = sample_rows([2, 1, 0], [True, False, False])
    assert layout.firsts == (0, 3, 5) and layout.sizes == (3, 2, 1) and layout.num_rows == 6
    assert layout.drawn == (0, 2)
    assert layout.drawn_rows == [0, 1, 2, 5]
    assert layout.rows_of(1) == slice(3, 5)


def test_drawn_values_split_back_per_sequence():
    layout = sample_rows([2, 1, 0], [True, False, False])
    assert per_drawn(layout, ["a", "b", "c", "d"]) == {0: ["a", "b", "c"], 2: ["d"]}


def test_no_sequences():
    layout = sample_rows([], [])
    assert layout.num_rows == 0 and layout.drawn_rows == [] and per_drawn(layout, []) == {}
