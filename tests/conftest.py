"""Shared fixtures: one tiny Hugging Face-format model per test session, loaded through the real path."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A default tiny Llama model (seed 0) written once; tests must not modify it."""
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model  # torch only for tests that use it

    return create_tiny_model(tmp_path_factory.mktemp("tiny-model"), TinySpec(seed=0))
