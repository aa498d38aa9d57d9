"""JupyterHub custom scopes of the pool and who may do what with them.

``custom:gpupool:use`` lets users (and their servers' tokens) see and change their *own* leases
and quota; ``spawn`` is for the hub-side spawner, acting for any user; ``admin`` for admins;
``agent`` for node agents; ``reclaim`` for the idle-GPU reclaimer. A filtered scope
(``custom:gpupool:use!user=alice``) is honoured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USE = "custom:gpupool:use"
SPAWN = "custom:gpupool:spawn"
ADMIN = "custom:gpupool:admin"
AGENT = "custom:gpupool:agent"
RECLAIM = "custom:gpupool:reclaim"
#: JupyterHub's own scope for reading metrics: a Prometheus service's token holds it.
METRICS_SCOPE = "read:metrics"

#: Paste into ``c.JupyterHub.custom_scopes`` (the docs show the whole hub config).
CUSTOM_SCOPES = {
    USE: {"description": "Use the GPU pool: your own leases, quota and utilization."},
    SPAWN: {"description": "Request, bind and release GPU leases for any user (the spawner)."},
    ADMIN: {
        "description": "Administer the GPU pool: quotas, nodes, every lease, usage reports.",
        "subscopes": [SPAWN, RECLAIM],
    },
    AGENT: {"description": "Report GPU inventory and utilization samples (node agents)."},
    RECLAIM: {
        "description": "Run the idle-GPU reclaimer: read live leases, post what the hub and the "
        "users' servers show, carry out reclaims."
    },
}


@dataclass(frozen=True)
class Identity:
    """Who is calling, from the hub's token model."""

    kind: str
    name: str
    scopes: frozenset[str]
    groups: tuple[str, ...] = ()

    @classmethod
    def from_hub_model(cls, model: dict[str, Any]) -> Identity:
        """Build from the model ``HubAuth`` returns (``kind``, ``name``, ``scopes``, ``groups``)."""
        return cls(
            kind=model.get("kind", "user"),
            name=model["name"],
            scopes=frozenset(model.get("scopes", ())),
            groups=tuple(model.get("groups") or ()),
        )

    def _has(self, scope: str, user: str | None = None) -> bool:
        if scope in self.scopes:
            return True
        if user is None:
            return False
        return f"{scope}!user={user}" in self.scopes

    @property
    def is_admin(self) -> bool:
        """Holds ``custom:gpupool:admin`` (unfiltered)."""
        return ADMIN in self.scopes

    @property
    def is_spawner(self) -> bool:
        """May act for any user (the spawner, or an admin)."""
        return self.is_admin or SPAWN in self.scopes

    @property
    def is_agent(self) -> bool:
        """May report inventory and samples."""
        return self.is_admin or AGENT in self.scopes

    @property
    def is_reclaimer(self) -> bool:
        """May run reclaim rounds and carry out reclaims (the reclaimer, or an admin)."""
        return self.is_admin or RECLAIM in self.scopes

    def may_use_for(self, user: str) -> bool:
        """May read and change ``user``'s leases: the spawner/admin, or ``user`` themself."""
        if self.is_spawner:
            return True
        return self.kind == "user" and self.name == user and self._has(USE, user)

    @property
    def may_use(self) -> bool:
        """Holds any form of the use scope (own things) or more."""
        return self.is_spawner or self._has(USE, self.name if self.kind == "user" else None)

    def describe(self) -> str:
        """For audit events: ``user:alice`` or ``service:gpupool-spawner``."""
        return f"{self.kind}:{self.name}"
