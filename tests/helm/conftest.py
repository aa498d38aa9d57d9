"""Render the chart through Helm's own engine (helm-python-sdk binds Helm's Go SDK)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "jupyterhub-gpupool"
RELEASE = "gpupool"
NAMESPACE = "jhub"

#: Every option of the chart on (the ones that exclude others get their own cases).
ALL_ON: dict[str, Any] = {
    "clusterName": "eu-west-1",
    "imagePullSecrets": ["registry-credentials"],
    "hub": {"namedServerLimitPerUser": 3},
    "apiTokens": {"existingSecret": "", "pool": "t-pool", "agent": "t-agent", "reclaimer": "t-rc"},
    "database": {"type": "postgresql"},
    "postgresql": {"enabled": True, "password": "p@ss/word", "storageClassName": "fast"},
    "mig": {"strategy": "mixed", "repartition": {"enabled": True}},
    "occupancy": {"enabled": True},
    "gpuKernels": {"kubernetes": {"enabled": True}},
    "poolConfig": {
        "offers": [
            {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
            {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "count": 1},
        ],
        "quotas": {"default": {"guarantee": 0, "limit": 2}},
    },
    "pool": {
        "replicas": 2,
        "image": {"tag": "1.2.3", "pullPolicy": "Always"},
        "config": {"PoolService": {"grant_timeout": 900}},
        "extraArgs": ["--PoolService.aging_interval=300"],
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        # another cluster's API token and CA (MigLabeller.cluster_apis)
        "extraVolumes": [{"name": "us-api", "secret": {"secretName": "gpupool-us-api"}}],
        "extraVolumeMounts": [{"name": "us-api", "mountPath": "/etc/gpupool/us", "readOnly": True}],
        "nodeSelector": {"pool": "core"},
        "tolerations": [{"key": "core", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "pool"}
                            },
                        },
                    }
                ]
            }
        },
        "labels": {"team": "platform"},
        "annotations": {"example.org/owner": "platform"},
        "priorityClassName": "core",
        "serviceAccount": {"annotations": {"example.org/sa": "yes"}},
        "service": {"annotations": {"example.org/svc": "yes"}},
        "networkPolicy": {
            "interNamespaceAccessLabels": "accept",
            "prometheus": {"enabled": True},
            "egress": [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}],
            "egressAllowRules": {"cloudMetadataServer": True},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                            }
                        }
                    ]
                }
            ],
        },
    },
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "tokenSecret": {"name": "prometheus-token", "key": "token"},
    },
    "agent": {
        "interval": 2.5,
        "podResources": {"enabled": True},
        "networkPolicy": {"egressAllowRules": {"privateIPs": True}},
        "extraArgs": ["--NodeAgent.inventory_interval=60"],
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "labels": {"team": "platform"},
        "annotations": {"example.org/owner": "platform"},
        "priorityClassName": "system-node-critical",
    },
    "alerts": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "alertLabels": {"team": "gpu"},
        "disabled": ["GPUPoolIdleGPUHours"],
    },
    "reclaimer": {
        "logLevel": "DEBUG",
        "extraArgs": ["--debug"],
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "nodeSelector": {"pool": "core"},
        "labels": {"team": "platform"},
        "priorityClassName": "core",
    },
}

#: Cases rendered and validated besides the defaults and ALL_ON.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-on": ALL_ON,
    "external-postgresql": {
        "database": {"type": "postgresql", "existingSecret": "pool-db", "existingSecretKey": "u"},
        "pool": {"replicas": 3, "pdb": {"maxUnavailable": None, "minAvailable": 2}},
    },
    "postgresql-url": {
        "database": {"type": "postgresql", "url": "postgresql://gpupool:pw@db/gpupool"},
    },
    # GitOps: every secret from an existing Secret (renders are byte-identical)
    "gitops-external": {
        "database": {"type": "postgresql", "existingSecret": "pool-db"},
        "pool": {"replicas": 2, "existingCookieSecret": "pool-cookie"},
    },
    "gitops-bundled-postgresql": {
        "database": {"type": "postgresql"},
        "postgresql": {"enabled": True, "existingSecret": "pool-pg"},
        "pool": {"existingCookieSecret": "pool-cookie", "existingCookieSecretKey": "key"},
    },
    # the agents' dynamic MIG, where the DRA driver (not the device plugin) serves the GPUs
    "agent-dynamic-mig": {
        "devicePlugin": {"enabled": False},
        "agent": {"dynamicMig": {"enabled": True}, "runtimeClassName": None},
    },
    # a remote cluster's GPU nodes joining a pool that runs elsewhere
    "agents-only": {
        "clusterName": "us-east-1",
        "pool": {"enabled": False},
        "reclaimer": {"enabled": False},
        "agent": {"serviceUrl": "https://hub.example.org/services/gpupool/"},
        "apiTokens": {"existingSecret": "", "agent": "t-agent"},
    },
    "minimal": {
        "rbac": {"create": False},
        "agent": {"enabled": False},
        "reclaimer": {"enabled": False},
        "pool": {
            "pdb": {"enabled": False},
            "networkPolicy": {"enabled": False},
            "serviceAccount": {"create": False},
        },
        "fullnameOverride": None,
    },
}


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` as given (Helm merges them over values.yaml); a deep copy."""
    return copy.deepcopy(overrides)


@pytest.fixture(scope="session")
def chart():
    """The chart, loaded once."""
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """Render with values → the manifests (NOTES.txt and empty templates left out)."""

    def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
        files = chart.render(values=merged(values), name=RELEASE, namespace=NAMESPACE)
        out = []
        for name, text in sorted(files.items()):
            if name.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    out.append(doc)
        return out

    return _render


def by_kind(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict]:
    """The manifests of one kind (and name)."""
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one manifest of that kind and name."""
    found = by_kind(manifests, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(manifests: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every Deployment, DaemonSet, StatefulSet and Job."""
    return [
        (f"{m['kind']}/{m['metadata']['name']}", m["spec"]["template"]["spec"])
        for m in manifests
        if m["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}
    ]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod spec's init containers and containers."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def load_yaml(path: Path) -> Any:
    """A YAML file."""
    return yaml.safe_load(path.read_text())
