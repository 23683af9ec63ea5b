"""Thin kopf entry points: every watch event becomes a trigger for the level-based reconcile.

Only `on.event` handlers and no timers, so kopf adds no finalizers and writes no bookkeeping to the
InferenceService; children map to their parent through the controller owner reference.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf

from tandem.operator.reconcile import Reconciler
from tandem.operator.runtime.cache import ObjectCache
from tandem.operator.runtime.health import HEARTBEAT
from tandem.operator.runtime.kube import Kube, Login
from tandem.operator.runtime.queue import ReconcileQueue
from tandem.spec import API_GROUP, API_VERSION, KIND

log = logging.getLogger("tandem.operator")

CHILD_EVENT_DELAY = float(os.environ.get("TANDEM_CHILD_EVENT_DELAY", "0.05"))
# kopf retries a failed API request with these pauses, then lets the error stop the operator; its default
# (about a minute in all) is shorter than an API server restart or upgrade can take. About ten minutes here.
API_RETRY_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21, *[30] * 20)


@dataclass
class Runtime:
    """What the handlers share, made once at startup and kept on kopf's memo: the API client, the watch
    cache, the reconciler, its queue, and the background tasks."""

    kube: Kube
    cache: ObjectCache
    queue: ReconcileQueue
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def start(cls, login: Login) -> Runtime:
        kube, cache = Kube(login), ObjectCache()
        reconciler = Reconciler(kube, cache)
        queue = ReconcileQueue(
            reconciler.reconcile, concurrency=int(os.environ.get("TANDEM_OPERATOR_WORKERS", "8"))
        )
        rt = cls(kube, cache, queue)
        loop = asyncio.get_running_loop()
        rt.tasks.append(
            loop.create_task(queue.resync_forever(float(os.environ.get("TANDEM_RESYNC_SECONDS", "60"))))
        )
        rt.tasks.append(loop.create_task(_beat_forever()))
        rt.tasks.append(_start_autoscaler(kube, cache))
        return rt


class EventsOnly(kopf.AnnotationsDiffBaseStorage):
    """kopf builds every watched object's essence (a deep copy of its body) to diff it for change handlers;
    with only `on.event` handlers nothing reads it, and building it was a fifth of the operator's CPU while
    objects were created. The essence here is empty."""

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[str | tuple[str, ...] | list[str] | None] | None = None,
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def parent_of(meta: dict[str, Any]) -> str | None:
    """The InferenceService that controls a child, from its owner references."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(API_GROUP + "/"):
            return ref.get("name")
    return None


def _owned(meta: dict[str, Any], **_: Any) -> bool:
    return parent_of(meta) is not None


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf connects as the operator's own client does (runtime/credentials.py), and logs in again through
    it when the API server answers 401."""
    info: kopf.ConnectionInfo = memo.login()
    return info


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = API_RETRY_BACKOFFS
    settings.persistence.diffbase_storage = EventsOnly()
    memo.tandem = Runtime.start(memo.login)


async def _beat_forever() -> None:
    """Tell /healthz the event loop still turns."""
    while True:
        HEARTBEAT.beat()
        await asyncio.sleep(5)


def _start_autoscaler(kube: Kube, cache: ObjectCache) -> asyncio.Task[None]:
    """The SLO autoscaler for InferenceServices with autoscaling on (it writes nothing for the others)."""
    from prometheus_client import start_http_server

    from tandem.operator.autoscale.backends.kube.loop import KubeAutoscalers, prometheus_url_from_env

    autoscalers = KubeAutoscalers(kube, cache, prometheus_url_from_env())
    port = int(os.environ.get("TANDEM_OPERATOR_METRICS_PORT", "0"))
    if port:
        start_http_server(
            port,
            addr=os.environ.get("TANDEM_OPERATOR_METRICS_ADDR", "0.0.0.0"),
            registry=autoscalers.metrics.registry,
        )
    return asyncio.get_running_loop().create_task(autoscalers.run_forever())


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime | None = getattr(memo, "tandem", None)
    for task in rt.tasks if rt else ():
        task.cancel()


@kopf.on.event(API_GROUP, API_VERSION, "inferenceservices")  # type: ignore[arg-type]
async def service_event(
    type: str, event: dict[str, Any], name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    rt: Runtime = memo.tandem
    key = (namespace, name)
    if type == "DELETED":
        rt.cache.forget(event["object"], KIND)
        rt.queue.forget(key)
        return
    rt.cache.put(event["object"], KIND)
    rt.queue.known.add(key)
    rt.queue.trigger(key, generation=(event["object"].get("metadata") or {}).get("generation"))


async def _child_event(
    type: str,
    event: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt: Runtime = memo.tandem
    if type == "DELETED":
        rt.cache.forget(event["object"], resource.kind)
    else:
        rt.cache.put(event["object"], resource.kind)
    parent = parent_of(meta)
    if parent:
        rt.queue.trigger((namespace, parent), delay=CHILD_EVENT_DELAY)


for _resource in (
    ("apps", "v1", "deployments"),
    ("v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    (API_GROUP, API_VERSION, "tandempools"),
):
    kopf.on.event(*_resource, when=_owned, id=f"child-{_resource[-1]}")(_child_event)  # type: ignore[arg-type]
