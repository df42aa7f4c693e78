"""The garbage collector over a bare Store: which owners count as live.

A Store of its own, with no scheduler or kubelet, so the collector is the only thing acting.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubesim import gc
from kubesim.store import Store


def _node(store: Store, name: str) -> dict[str, Any]:
    return store.create("nodes", {"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": name}, "spec": {}, "status": {}})


def _lease_owned_by(store: Store, node: dict[str, Any]) -> dict[str, Any]:
    meta = node["metadata"]
    return store.create("leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": meta["name"], "namespace": "kube-node-lease", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}]},
        "spec": {"holderIdentity": meta["name"]}})


def test_a_lease_owned_by_an_existing_node_is_not_collected() -> None:
    store = Store()
    _lease_owned_by(store, _node(store, "n1"))
    gc.collect(store)
    assert store.get("leases", "kube-node-lease", "n1") is not None


def test_a_lease_whose_node_was_replaced_under_the_same_name_is_collected() -> None:
    # Owners are matched by uid: a new Node of the same name is not the Lease's owner.
    store = Store()
    _lease_owned_by(store, _node(store, "n1"))
    store.remove("nodes", None, "n1")
    _node(store, "n1")
    gc.collect(store)
    assert store.get("leases", "kube-node-lease", "n1") is None


def test_deleting_a_node_wakes_the_collector_and_its_lease_goes() -> None:
    async def scenario() -> tuple[bool, bool]:
        store = Store()
        _lease_owned_by(store, _node(store, "keep"))
        _lease_owned_by(store, _node(store, "gone"))
        collector = asyncio.create_task(gc.run(store))
        await asyncio.sleep(0)  # let the collector subscribe before the change
        store.remove("nodes", None, "gone")
        try:
            for _ in range(200):
                if store.get("leases", "kube-node-lease", "gone") is None:
                    break
                await asyncio.sleep(0.01)
        finally:
            collector.cancel()
        return (store.get("leases", "kube-node-lease", "gone") is None,
                store.get("leases", "kube-node-lease", "keep") is not None)

    assert asyncio.run(scenario()) == (True, True)
