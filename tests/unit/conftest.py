"""Fixtures the unit tests share."""

import pytest

from tandem.worker.hf.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir) -> Tokenizer:
    """The tiny model's tokenizer (tiny_model_dir: tests/conftest.py)."""
    return Tokenizer.from_dir(tiny_model_dir)
