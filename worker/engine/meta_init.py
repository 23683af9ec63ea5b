"""Models built on `meta` for a checkpoint to fill, without their random init: on `meta` that init runs
torch's reference ops, whose first use imports torch._dynamo (seconds of every worker's start)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

import torch

# what torch.nn's own layers (Linear, Embedding, ...) call in reset_parameters
INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "xavier_uniform_")


def _keep(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


@contextmanager
def on_meta_uninitialised() -> Iterator[None]:
    """Modules made inside have their parameters on `meta`, never initialised (they are assigned next)."""
    with ExitStack() as stack:
        stack.enter_context(torch.device("meta"))
        for name in INITS:
            stack.enter_context(mock.patch.object(torch.nn.init, name, _keep))
        yield
