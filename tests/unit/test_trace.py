"""The shared trace reader: common JSONL field names, seconds or milliseconds, Azure CSV wall-clock times."""

import json

import pytest

from tandem.trace import load_trace, parse_jsonl, parse_timestamp


@pytest.mark.parametrize(
    "record",
    [
        {"timestamp": 5.0, "input_length": 10, "output_length": 3},
        {"time": 5.0, "prompt_tokens": 10, "completion_tokens": 3},
        {"arrival_time": 5.0, "input_tokens": 10, "output_tokens": 3},
    ],
)
def test_common_field_names(record):
    first = {**record, next(iter(record)): 1.0}
    assert parse_jsonl([json.dumps(first), json.dumps(record)])[1] == (4.0, 10, 3)


def test_epoch_milliseconds_are_recognised(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1_700_000_000_000, "input_len": 1, "output_len": 1},
        {"timestamp": 1_700_000_002_500, "input_len": 1, "output_len": 1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [r.arrival_s for r in load_trace(path)] == [0.0, 2.5]
    assert (
        parse_jsonl(
            [
                '{"ts": 1000, "input_len": 1, "output_len": 1}',
                '{"ts": 3000, "input_len": 1, "output_len": 1}',
            ],
            "ms",
        )[1].arrival_s
        == 2.0
    )


def test_wall_clock_with_seven_fraction_digits():
    assert parse_timestamp("2023-11-16 18:17:04.0319600") - parse_timestamp(
        "2023-11-16 18:17:03.9799600"
    ) == pytest.approx(0.052)


def test_a_record_without_lengths_names_what_it_looked_for():
    with pytest.raises(ValueError, match="input length"):
        parse_jsonl(['{"timestamp": 1, "output_len": 2}'])
