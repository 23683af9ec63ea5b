"""Whether a live child differs from its rendered manifest (pure), so that steady state writes nothing."""

from __future__ import annotations

from typing import Any

from tandem.operator.manifests.manifest import HASH_ANNOTATION


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field set in `desired` has the same value in `live` (server defaults are ignored).

    A zero value (false, 0, "", empty) that the server leaves out (Go `omitempty`) counts as equal.
    """
    if live is None and desired in (False, 0, "", [], {}):
        return True
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        return all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list):
            return False
        return len(desired) == len(live) and all(is_subset(d, x) for d, x in zip(desired, live, strict=True))
    return desired == live


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Apply when the child is missing, was rendered from another spec (hash), or was edited (drift)."""
    if live is None:
        return True
    want = desired.get("metadata", {}).get("annotations", {}).get(HASH_ANNOTATION)
    have = (live.get("metadata", {}).get("annotations") or {}).get(HASH_ANNOTATION)
    if want != have:
        return True
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    return not is_subset(body, live)
