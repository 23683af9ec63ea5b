"""Pure checks of what a spec needs from the cluster that admission cannot see: the model's
PersistentVolumeClaim exists, and some node offers the GPUs one worker asks for.

The rule: a missing or lost claim blocks (nothing new is applied, so no pod sits on GPUs waiting for a
volume); a GPU shortfall is reported but never blocks, because a node autoscaler adds nodes only for pods
that are pending, and a cluster whose GPU nodes have not joined yet must still converge once they do.
Facts the operator may not read (a Role without node access) are unknown and report nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem import names
from tandem.spec import InferenceServiceSpec

GPU = "nvidia.com/gpu"
Problem = tuple[str, str]  # (reason, message)


@dataclass(frozen=True)
class NodeGpus:
    """What the GPU check needs of one node."""

    name: str
    labels: dict[str, str]
    gpus: int  # allocatable nvidia.com/gpu


@dataclass(frozen=True)
class Facts:
    """What the reconcile read. `claims`: claim name -> phase, None when it does not exist; a claim it
    could not read is left out. `nodes`: None when the operator may not list nodes."""

    claims: dict[str, str | None] = field(default_factory=dict)
    nodes: tuple[NodeGpus, ...] | None = None


@dataclass(frozen=True)
class Findings:
    blocked: Problem | None = None  # nothing new may be applied until this is fixed
    pools: dict[str, list[Problem]] = field(default_factory=dict)  # reported on the pool, applied anyway

    @property
    def any(self) -> bool:
        return self.blocked is not None or any(self.pools.values())


def claims_needed(spec: InferenceServiceSpec) -> list[str]:
    """PersistentVolumeClaims the pods mount."""
    return [spec.model.source.pvc.claim_name] if spec.model.source.pvc else []


def node_gpus(node: dict[str, Any]) -> NodeGpus:
    """One Node object reduced to its name, labels and allocatable GPUs (0 when it has none)."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    raw = str((status.get("allocatable") or {}).get(GPU, "0"))
    return NodeGpus(meta.get("name", "?"), dict(meta.get("labels") or {}), int(raw) if raw.isdigit() else 0)


def _gpus_per_worker(spec: InferenceServiceSpec, pool: str) -> tuple[int, dict[str, str]]:
    if pool == names.POOL_ROUTER:
        return spec.router.resources.gpus, {}
    ps = spec.prefill if pool == names.POOL_PREFILL else spec.decode  # the colocated pool uses decode
    return ps.resources.gpus, ps.node_selector


def _gpu_problem(
    pool: str, need: int, selector: dict[str, str], nodes: tuple[NodeGpus, ...]
) -> Problem | None:
    fits = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
    where = (
        f" matching nodeSelector {','.join(f'{k}={v}' for k, v in sorted(selector.items()))}"
        if selector
        else ""
    )
    with_gpus = [n for n in fits if n.gpus > 0]
    if not with_gpus:
        return (
            "NoGPUNodes",
            f"no node{where} offers {GPU} yet and a {pool} worker needs {need}: its pods wait "
            "for a GPU node to join (or the GPU device plugin to report one)",
        )
    biggest = max(with_gpus, key=lambda n: n.gpus)
    if biggest.gpus < need:
        return (
            "InsufficientGPUs",
            f"a {pool} worker asks for {need} {GPU} but the largest node{where} has "
            f"{biggest.gpus} ({biggest.name}): lower {pool}.resources.gpus or add a "
            "bigger node",
        )
    return None


def check(spec: InferenceServiceSpec, pools: list[str], facts: Facts) -> Findings:
    """Findings for these pools (worker pools and the router) from what the reconcile read."""
    for claim in claims_needed(spec):
        if claim not in facts.claims:
            continue  # could not read it: unknown
        phase = facts.claims[claim]
        if phase is None:
            return Findings(
                blocked=(
                    "ModelSourceNotFound",
                    f'spec.model.source.pvc.claimName: PersistentVolumeClaim "{claim}" not found; '
                    "the pools are created once it exists",
                )
            )
        if phase == "Lost":
            return Findings(
                blocked=(
                    "ModelSourceLost",
                    f"spec.model.source.pvc.claimName: PersistentVolumeClaim "
                    f'"{claim}" is Lost (its volume is gone)',
                )
            )
    found: dict[str, list[Problem]] = {}
    if facts.nodes is not None:
        for pool in pools:
            need, selector = _gpus_per_worker(spec, pool)
            if need and (problem := _gpu_problem(pool, need, selector, facts.nodes)):
                found[pool] = [problem]
    return Findings(pools=found)
