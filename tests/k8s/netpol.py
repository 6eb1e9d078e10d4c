"""A reading of NetworkPolicy for tests: does a set of policies let one pod (or address) connect to another?

It follows the API's rules: a pod selected by some policy of a direction (Ingress/Egress) is isolated in that
direction and gets only what some rule of those policies allows; a connection needs the source's egress and the
target's ingress. A peer with both namespaceSelector and podSelector means pods matching both. An ipBlock is also
matched against pod addresses, as Calico does: the stricter reading.
"""

from __future__ import annotations

import ipaddress


def selects(selector: dict, labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e["values"],
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def endpoint(namespace: str | None, labels: dict[str, str] | None, ip: str) -> dict:
    """A pod (namespace and labels) or an address outside the cluster (namespace None)."""
    return {"namespace": namespace, "labels": labels or {}, "ip": ipaddress.ip_address(ip)}


def peer_matches(peer: dict, policy_namespace: str, other: dict) -> bool:
    if "ipBlock" in peer:  # also matched against pod addresses, as Calico does: the stricter reading
        block = peer["ipBlock"]
        return (other["ip"] in ipaddress.ip_network(block["cidr"])
                and not any(other["ip"] in ipaddress.ip_network(e) for e in block.get("except", [])))
    if other["namespace"] is None:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": other["namespace"]}):
            return False
    elif other["namespace"] != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, other["labels"])


def allowed(policies: list[dict], pod: dict, other: dict, port: int, direction: str, protocol: str = "TCP") -> bool:
    """Whether the policies let `pod` send to (Egress) or receive from (Ingress) `other` on that port."""
    mine = [p for p in policies if p["metadata"]["namespace"] == pod["namespace"]
            and selects(p["spec"]["podSelector"], pod["labels"]) and direction in p["spec"]["policyTypes"]]
    if not mine:
        return True  # not isolated in that direction
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in mine:
        for rule in policy["spec"].get(key, []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port and p.get("protocol", "TCP") == protocol for p in ports):
                continue
            peers = rule.get(peers_key)
            if not peers or any(peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers):
                return True
    return False


def connects(policies: list[dict], source: dict, target: dict, port: int, protocol: str = "TCP") -> bool:
    return (allowed(policies, source, target, port, "Egress", protocol)
            and allowed(policies, target, source, port, "Ingress", protocol))


