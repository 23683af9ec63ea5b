"""The CRDs of the projects tandem lives beside (Gateway API, its Inference Extension, KServe), read from
their Go modules through the Go module proxy and cached by version, so tests install the real ones."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

# module -> (version, folder inside the module, file glob): what each project's own install applies
MODULES = {
    "sigs.k8s.io/gateway-api": ("v1.6.3", "config/crd/standard", "gateway.networking.k8s.io_*.yaml"),
    "sigs.k8s.io/gateway-api-inference-extension": ("v1.2.0", "config/crd/bases", "*.yaml"),
    "github.com/kserve/kserve": ("v0.16.0", "config/crd/full", "serving.kserve.io_*.yaml"),
}


def _cache_root() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem")) / "upstream-crds"


def crd_files(module: str) -> list[Path]:
    """The module's CRD files, fetched with `go mod download` once per version into the cache.
    Raises RuntimeError when they are neither cached nor fetchable."""
    version, folder, pattern = MODULES[module]
    dest = _cache_root() / f"{module.replace('/', '_')}@{version}"
    if not (dest / ".complete").exists():
        if shutil.which("go") is None:
            raise RuntimeError(f"go is not installed and {module}@{version} CRDs are not cached")
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            cwd="/",
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
        info = json.loads(out.stdout or "{}")
        if out.returncode != 0 or "Dir" not in info:
            raise RuntimeError(
                f"go mod download {module}@{version}: {info.get('Error') or out.stderr.strip()}"
            )
        src = sorted((Path(info["Dir"]) / folder).glob(pattern))
        if not src:
            raise RuntimeError(f"{module}@{version} has no {folder}/{pattern}")
        dest.mkdir(parents=True, exist_ok=True)
        for f in src:
            shutil.copyfile(f, dest / f.name)
        (dest / ".complete").write_text(version)
    return sorted(dest.glob(pattern))


@functools.cache
def crds(module: str) -> tuple[dict, ...]:
    """Every CustomResourceDefinition document of the module (the files also hold other policy objects)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # KServe's run to megabytes
    return tuple(
        d
        for f in crd_files(module)
        for d in yaml.load_all(f.read_text(), Loader=loader)
        if d and d.get("kind") == "CustomResourceDefinition"
    )
