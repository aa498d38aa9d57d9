"""The chart in production (issue 33): least-privilege RBAC and API tokens, agents-only installs
reporting to a remote pool, NetworkPolicies with ingress and egress that survive
``nameOverride``, and the combinations the chart refuses."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import ALL_ON, NAMESPACE, VARIANTS, by_kind, one, pod_specs

REPARTITION = {"mig": {"repartition": {"enabled": True}}}
OCCUPANCY = {"occupancy": {"enabled": True}}


def granted(manifests: list[dict[str, Any]]) -> dict[str, set[str]]:
    """resource → verbs of the pool's ClusterRole (empty: no role rendered)."""
    out: dict[str, set[str]] = {}
    for role in by_kind(manifests, "ClusterRole"):
        for rule in role["rules"]:
            (group,) = rule["apiGroups"]
            for resource in rule["resources"]:
                name = f"{resource}.{group}" if group else resource
                out.setdefault(name, set()).update(rule["verbs"])
    return out


def automount(manifests: list[dict[str, Any]]) -> dict[str, bool]:
    """workload → whether its pods get an API token."""
    return {w: spec.get("automountServiceAccountToken", True) for w, spec in pod_specs(manifests)}


def test_by_default_nothing_is_granted_and_no_pod_gets_an_api_token(render) -> None:
    manifests = render({})
    assert granted(manifests) == {}
    assert by_kind(manifests, "ClusterRoleBinding") == []
    assert not any(automount(manifests).values()), automount(manifests)
    for sa in by_kind(manifests, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False, sa["metadata"]["name"]


def test_repartition_grants_exactly_what_the_labeller_calls(render) -> None:
    manifests = render(REPARTITION)
    # kube/client.py: get_node, patch_labels (merge patch), node_events (list events)
    assert granted(manifests) == {"nodes": {"get", "patch"}, "events": {"list"}}
    tokens = automount(manifests)
    assert tokens.pop("Deployment/gpupool") is True
    assert not any(tokens.values()), tokens
    binding = one(manifests, "ClusterRoleBinding", f"{NAMESPACE}-gpupool")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupool", "namespace": NAMESPACE}
    ]
    assert binding["roleRef"]["name"] == f"{NAMESPACE}-gpupool"


DRA_LISTS = {"resourceslices.resource.k8s.io": {"list"}, "resourceclaims.resource.k8s.io": {"list"}}


def test_occupancy_reads_pods_and_nodes(render) -> None:
    """kube/occupancy.py lists nodes and, per backend, pods (device plugin) or ResourceSlices and
    ResourceClaims (DRA) each round, nothing more; the service is told to, and which backend."""
    manifests = render(OCCUPANCY)
    assert granted(manifests) == {"pods": {"list"}, "nodes": {"list"}, **DRA_LISTS}
    both = granted(render({**REPARTITION, **OCCUPANCY}))
    assert both == {
        "pods": {"list"},
        "nodes": {"get", "list", "patch"},
        "events": {"list"},
        **DRA_LISTS,
    }
    plugin = render({"occupancy": {"enabled": True, "backend": "device-plugin"}})
    assert granted(plugin) == {"pods": {"list"}, "nodes": {"list"}}
    dra = render({"occupancy": {"enabled": True, "backend": "dra"}})
    assert granted(dra) == {"nodes": {"list"}, **DRA_LISTS}
    args = one(dra, "Deployment", "gpupool")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--KubeOccupancy.backend=dra" in args
    assert automount(manifests)["Deployment/gpupool"] is True
    pool = one(manifests, "Deployment", "gpupool")
    assert (
        "--KubeOccupancy.enabled=True" in pool["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert "--KubeOccupancy.enabled=True" not in str(render({}))


def test_pod_resources_mounts_the_socket_and_lets_agents_list_pods_only(render) -> None:
    """agent.podResources: the kubelet's socket folder read-only, the reader pointed at it, and
    a token allowed to list pods (to find the pool's pods on the node); nothing else changes."""
    manifests = render({"agent": {"podResources": {"enabled": True}}})
    (agent,) = by_kind(manifests, "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    container = spec["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    sock = "--NodeAgent.pod_resources_socket=/var/lib/kubelet/pod-resources/kubelet.sock"
    assert sock in container["args"]
    role = one(manifests, "ClusterRole", f"{NAMESPACE}-gpupool-agent")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = one(manifests, "ClusterRoleBinding", f"{NAMESPACE}-gpupool-agent")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    tokens = automount(manifests)
    assert tokens.pop("DaemonSet/gpupool-agent") is True
    assert not any(tokens.values()), tokens  # the pool's pod still gets none


def test_without_rbac_create_the_pod_still_gets_its_token_for_a_role_of_your_own(render) -> None:
    manifests = render({**REPARTITION, "rbac": {"create": False}})
    assert granted(manifests) == {}
    assert automount(manifests)["Deployment/gpupool"] is True


def test_an_agents_only_install_renders_agents_and_their_token_only(render) -> None:
    manifests = render(VARIANTS["agents-only"])
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in manifests)
    assert kinds == [
        ("DaemonSet", "gpupool-agent"),
        ("NetworkPolicy", "gpupool-agent"),
        ("Secret", "gpupool-secret"),
        ("ServiceAccount", "gpupool-agent"),
    ]
    import base64

    secret = one(manifests, "Secret", "gpupool-secret")
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "agent-token": "t-agent"
    }
    spec = one(manifests, "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["GPUPOOL_SERVICE_URL"]["value"] == "https://hub.example.org/services/gpupool/"
    assert env["GPUPOOL_CLUSTER"]["value"] == "us-east-1"
    assert env["GPUPOOL_AGENT_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "gpupool-secret",
        "key": "agent-token",
    }
    # with z2jh's hub Secret of that cluster, not even a Secret
    hub_secret = {**VARIANTS["agents-only"], "apiTokens": {"existingSecret": "hub"}}
    assert by_kind(render(hub_secret), "Secret") == []
    # the agents' policy: no rule to a pool that is not here, DNS only until egress is given
    policy = one(manifests, "NetworkPolicy", "gpupool-agent")
    assert all("podSelector" not in str(rule) for rule in policy["spec"]["egress"])
    with_egress = {
        **VARIANTS["agents-only"],
        "agent": {
            **VARIANTS["agents-only"]["agent"],
            "networkPolicy": {"egress": [{"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]}]},
        },
    }
    policy = one(render(with_egress), "NetworkPolicy", "gpupool-agent")
    assert {"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]} in policy["spec"]["egress"]


def test_the_agents_report_to_a_given_service_url_beside_a_local_pool_too(render) -> None:
    url = "https://pool.example.org/services/gpupool/"
    spec = one(render({"agent": {"serviceUrl": url}}), "DaemonSet", "gpupool-agent")
    env = {e["name"]: e for e in spec["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUPOOL_SERVICE_URL"]["value"] == url


def _peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]


@pytest.mark.parametrize("name_override", [None, "gpu-pool"])
def test_network_policies_select_what_exists_with_and_without_name_override(
    render, name_override
) -> None:
    """Every podSelector of the chart's policies matches a pod the chart renders (ours by the
    labels helper) or names an access label (z2jh's or ours), never z2jh's app/component."""
    manifests = render(
        {
            "nameOverride": name_override,
            "postgresql": ALL_ON["postgresql"],
            "database": {"type": "postgresql"},
        }
    )
    pods = {w: None for w, _ in pod_specs(manifests)}
    labels = [
        m["spec"]["template"]["metadata"]["labels"]
        for m in manifests
        if m["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}
    ]
    assert pods
    access = {
        "hub.jupyter.org/network-access-hub",
        "hub.jupyter.org/network-access-proxy-api",
        "gpupool.jupyter.org/network-access-pool",
    }
    for policy in by_kind(manifests, "NetworkPolicy"):
        selected = policy["spec"]["podSelector"]["matchLabels"]
        assert any(selected.items() <= pod.items() for pod in labels), policy["metadata"]["name"]
        rules = [*policy["spec"].get("ingress", []), *policy["spec"].get("egress", [])]
        for rule in rules:
            for peer in [*rule.get("from", []), *rule.get("to", [])]:
                match = (peer.get("podSelector") or {}).get("matchLabels")
                if not match or "namespaceSelector" in peer:
                    continue
                assert "app" not in match and "component" not in match, match
                if set(match) & access:
                    continue
                assert any(match.items() <= pod.items() for pod in labels), (
                    policy["metadata"]["name"],
                    match,
                )
    pool = one(manifests, "NetworkPolicy", "gpupool")
    names = {
        p["podSelector"]["matchLabels"].get("app.kubernetes.io/name") for p in _peers(pool)
    } - {None}
    assert names == {name_override or "jupyterhub-gpupool"}


def test_pool_policy_admits_the_hub_proxy_users_and_our_components(render) -> None:
    manifests = render({})
    pool = one(manifests, "Deployment", "gpupool")["spec"]["template"]["metadata"]["labels"]
    reclaimer = one(manifests, "Deployment", "gpupool-reclaimer")["spec"]["template"]["metadata"]
    # z2jh's hub admits pods with this label to the hub API
    assert pool["hub.jupyter.org/network-access-hub"] == "true"
    assert reclaimer["labels"]["hub.jupyter.org/network-access-hub"] == "true"
    policy = one(manifests, "NetworkPolicy", "gpupool")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    peers = [p["podSelector"]["matchLabels"] for p in _peers(policy)]
    assert {"hub.jupyter.org/network-access-hub": "true"} in peers  # proxy, user servers
    assert {"hub.jupyter.org/network-access-proxy-api": "true"} in peers  # the hub
    assert {"gpupool.jupyter.org/network-access-pool": "true"} in peers
    components = {p.get("app.kubernetes.io/component") for p in peers} - {None}
    assert components == {"agent", "reclaimer"}
    assert all("namespaceSelector" not in p for p in _peers(policy))  # ignore: this namespace
    # egress in z2jh's defaults for a hub-like component: DNS, private and non-private IPs,
    # never the cloud metadata server
    cidrs = [
        b["ipBlock"]["cidr"]
        for rule in policy["spec"]["egress"]
        for b in rule.get("to", [])
        if "ipBlock" in b
    ]
    assert "0.0.0.0/0" in cidrs and "10.0.0.0/8" in cidrs
    everything = next(
        b
        for r in policy["spec"]["egress"]
        for b in r["to"]
        if b.get("ipBlock", {}).get("cidr") == "0.0.0.0/0"
    )
    assert "169.254.169.254/32" in everything["ipBlock"]["except"]
    assert any(
        {"port": 53, "protocol": "UDP"} in rule.get("ports", [])
        for rule in policy["spec"]["egress"]
    )


def test_prometheus_and_inter_namespace_access_by_value(render) -> None:
    off = render({})
    assert "monitoring" not in str(one(off, "NetworkPolicy", "gpupool")["spec"]["ingress"])
    manifests = render(ALL_ON)
    pool = one(manifests, "NetworkPolicy", "gpupool")["spec"]
    prom = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    assert {"ports": [{"port": "http"}], "from": [prom]} in pool["ingress"]
    reclaimer = one(manifests, "NetworkPolicy", "gpupool-reclaimer")["spec"]
    assert reclaimer["ingress"] == [{"ports": [{"port": "metrics"}], "from": [prom]}]
    # accept: the access label reaches across namespaces, and labelled namespaces
    peers = _peers(one(manifests, "NetworkPolicy", "gpupool"))
    assert {
        "podSelector": {"matchLabels": {"gpupool.jupyter.org/network-access-pool": "true"}},
        "namespaceSelector": {"matchLabels": {}},
    } in peers
    assert {
        "namespaceSelector": {"matchLabels": {"gpupool.jupyter.org/network-access-pool": "true"}}
    } in peers
    # the values' own rules, the bundled database and the metadata server when allowed
    assert {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]} in pool["egress"]
    assert {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}]} in pool["egress"]
    to_db = pool["egress"][0]
    assert to_db["ports"] == [{"port": 5432}]
    assert to_db["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "postgresql"
    )


def test_agents_and_reclaimer_reach_the_pool_by_its_labels(render) -> None:
    manifests = render({})
    for name in ("gpupool-agent", "gpupool-reclaimer"):
        spec = one(manifests, "NetworkPolicy", name)["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        assert spec["ingress"] == []
        first = spec["egress"][0]
        assert first["ports"] == [{"port": 10101}]
        assert first["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
            "pool"
        )
    agent = one(manifests, "NetworkPolicy", "gpupool-agent")["spec"]["egress"]
    # least: the pool and DNS, nothing else by default
    assert len(agent) == 2 and {p["port"] for p in agent[1]["ports"]} == {53}


def test_the_service_mounts_another_clusters_api_credentials(render) -> None:
    spec = one(render(ALL_ON), "Deployment", "gpupool")["spec"]["template"]["spec"]
    assert {"name": "us-api", "secret": {"secretName": "gpupool-us-api"}} in spec["volumes"]
    (container,) = spec["containers"]
    assert {"name": "us-api", "mountPath": "/etc/gpupool/us", "readOnly": True} in container[
        "volumeMounts"
    ]


def test_dynamic_mig_beside_the_device_plugin_is_refused_naming_both_keys(chart) -> None:
    from .conftest import helm

    with pytest.raises(helm.HelmRenderError) as caught:
        chart.render(
            values={"agent": {"dynamicMig": {"enabled": True}}}, name="gpupool", namespace="jhub"
        )
    message = str(caught.value)
    assert "agent.dynamicMig.enabled: " in message and "devicePlugin.enabled: true" in message
    # the agents off, nothing to refuse
    chart.render(
        values={"agent": {"enabled": False, "dynamicMig": {"enabled": True}}}, name="gpupool"
    )


def test_the_notes_of_an_agents_only_install_name_the_remote_pool(chart) -> None:
    files = chart.render(values=VARIANTS["agents-only"], name="gpupool", namespace="jhub")
    notes = next(text for name, text in files.items() if name.endswith("NOTES.txt"))
    assert "report to the pool at\n  https://hub.example.org/services/gpupool/" in notes
    assert "cookie" not in notes and "hub.services" not in notes
