"""What the `tandem profile` commands share on their command lines: the program name and list arguments."""

from __future__ import annotations

import argparse

PROG = "tandem profile"


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from e
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values
