"""Shared fixtures: one tiny Hugging Face-format model per test session, loaded through the real path."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.slow_guard", "pytester"]

K8S = Path(__file__).resolve().parent / "k8s"


def pytest_collection_modifyitems(config, items):
    """The Kubernetes tests run last (their order kept): on a fresh machine the control plane they need may
    still be building, and CI builds it in the background while everything else runs."""
    items.sort(key=lambda item: K8S in Path(str(item.fspath)).resolve().parents)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A default tiny Llama model (seed 0) written once; tests must not modify it."""
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model  # torch only for tests that use it

    return create_tiny_model(tmp_path_factory.mktemp("tiny-model"), TinySpec(seed=0))


@pytest.fixture
def prometheus(tmp_path):
    """A factory: `prometheus(targets, **kw)` starts a real Prometheus (see tests/prometheus.py) scraping
    `targets` and returns its client; every server it started stops at teardown. Skips without the binary.
    For a module-scoped server use `tests.prometheus.running_prometheus` directly."""
    from contextlib import ExitStack

    from tests.prometheus import running_prometheus

    with ExitStack() as stack:
        count = iter(range(1000))

        def start(targets, **kw):
            return stack.enter_context(
                running_prometheus(targets, tmp_path / f"prometheus-{next(count)}", **kw)
            )

        yield start
