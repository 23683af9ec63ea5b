"""Where the pods of a Hugging Face model source keep what they download: a node folder or a ReadWriteMany
claim the chart configures (`modelCache`), shared by the pods of a node or of every node, so a model is
fetched once; without one, each pod's own emptyDir (fetched by every pod)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_HOST_PATH = "TANDEM_MODEL_CACHE_HOST_PATH"  # the chart's modelCache.hostPath
ENV_CLAIM = "TANDEM_MODEL_CACHE_CLAIM"  # the chart's modelCache.claimName


@dataclass(frozen=True)
class ModelCache:
    """One of: `host_path`, a node folder (each namespace gets its own folder below it, so no tenant reads or
    writes another's downloads), or `claim_name`, a ReadWriteMany claim of that name in each service's
    namespace."""

    host_path: str | None = None
    claim_name: str | None = None

    def __post_init__(self) -> None:
        if self.host_path and self.claim_name:
            raise ValueError("modelCache: set hostPath or claimName, not both")
        if self.host_path and not self.host_path.startswith("/"):
            raise ValueError(f"modelCache.hostPath must be an absolute path, not {self.host_path!r}")

    def volume(self, namespace: str) -> dict[str, Any]:
        """The pod volume named `model` for a service in `namespace`."""
        if self.host_path:
            return {
                "name": "model",
                "hostPath": {
                    "path": f"{self.host_path.rstrip('/')}/{namespace}",
                    "type": "DirectoryOrCreate",
                },
            }
        return {"name": "model", "persistentVolumeClaim": {"claimName": self.claim_name}}


def from_env(environ: Mapping[str, str] = os.environ) -> ModelCache | None:
    """The chart's cache, or None (each pod downloads into its own emptyDir). Raises ValueError when
    invalid."""
    host, claim = environ.get(ENV_HOST_PATH, "").strip(), environ.get(ENV_CLAIM, "").strip()
    if not host and not claim:
        return None
    return ModelCache(host_path=host or None, claim_name=claim or None)


@functools.cache
def process_model_cache() -> ModelCache | None:
    return from_env()
