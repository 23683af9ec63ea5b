"""A prefill or decode pod follows its `serving.tandem.dev/role` label: the operator moves the label to flip
the pod, the kubelet writes the pod's labels into a downward-API file, and this watch takes the role it
names (the same drain-then-switch as a SetRole call). At start, a pod that was flipped before it restarted
takes its label's role, not its Deployment's."""

from __future__ import annotations

import logging
from pathlib import Path

from tandem import names
from tandem.periodic import Every
from tandem.worker.serve.roles import DrainTimedOut, RoleRefused, RoleSwitch

log = logging.getLogger(__name__)


def role_from_labels(text: str) -> str | None:
    """The role label's value in a downward-API labels file (`key="value"` lines), if any (pure)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == names.LABEL_ROLE:
            return value.strip().strip('"') or None
    return None


class RoleLabelWatch:
    """Reads the labels file every `every_s` seconds and flips the worker when the role it names changes."""

    def __init__(self, path: str | Path, roles: RoleSwitch, every_s: float = 1.0) -> None:
        self.path, self.roles = Path(path), roles
        self._every = Every(every_s, self.check, "role-label")
        self._refused: str | None = None  # a role already refused: said once, not every second

    def check(self) -> str | None:
        """Take the labelled role now if it differs; returns the role the label names."""
        try:
            wanted = role_from_labels(self.path.read_text())
        except OSError:
            return None
        if wanted is None or wanted == self.roles.role or wanted == self._refused:
            return wanted
        try:
            self.roles.set_role(wanted, reason=f"{names.LABEL_ROLE} label")
            self._refused = None
        except (RoleRefused, DrainTimedOut) as e:
            log.warning("cannot take the labelled role %r: %s", wanted, e)
            self._refused = wanted if isinstance(e, RoleRefused) else None
        return wanted

    def start(self) -> RoleLabelWatch:
        self._every.start()
        return self

    def stop(self) -> None:
        self._every.stop()
