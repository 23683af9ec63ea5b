"""Pure reading of a pool's pods: why they cannot run (unschedulable, image pulls, crash loops), in words a
user can act on, so the InferenceService's conditions name the cause at once rather than after the
Deployment's progress deadline."""

from __future__ import annotations

from typing import Any

Body = dict[str, Any]

# Container waiting reasons that do not clear by waiting: each needs a fix (image, config, code, a Secret).
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def pod_problems(pods: list[Body]) -> list[tuple[str, str]]:
    """(reason, message) per distinct problem of these pods, the first pod's words, with a count of pods."""
    seen: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        for reason, message in _problems(pod):
            seen.setdefault((reason, message), []).append(meta.get("name", "?"))
    out = []
    for (reason, message), who in seen.items():
        subject = f"pod {who[0]}" if len(who) == 1 else f"{len(who)} pods (e.g. {who[0]})"
        out.append((reason, f"{subject}: {reason}: {message}"))
    return out


def _problems(pod: Body) -> list[tuple[str, str]]:
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return [("Unschedulable", _one_line(c.get("message") or "no node fits"))]
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING:
                words = waiting.get("message") or ""
                last = (cs.get("lastState") or {}).get("terminated") or {}
                if last:
                    code, reason = last.get("exitCode"), last.get("reason") or "Error"
                    words = f"last exit code {code} ({reason}) {words}".strip()
                out.append(
                    (waiting["reason"], _one_line(f"container {cs.get('name')}: {words}".rstrip(": ")))
                )
    return out


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
