"""Ray as the GCS sees it, read without a driver: the alive nodes, their GPUs and free slots."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def alive_nodes(address: str) -> dict[str, float]:
    """IP -> GPU count of every alive node, read straight from the GCS (no Ray driver)."""
    from ray._raylet import GcsClient

    nodes = GcsClient(address=address).get_all_node_info(timeout=5).values()
    return {n.node_manager_address: n.resources_total.get("GPU", 0) for n in nodes if n.state == 0}


def gpu_slots(address: str) -> dict[str, dict[str, float]]:
    """IP -> {"gpus": total, "free": available, "placed": held by placement groups} of
    every alive node, from the GCS (no driver)."""
    from ray._private.state import GlobalState
    from ray._raylet import GcsClient, GcsClientOptions

    nodes = GcsClient(address=address).get_all_node_info(timeout=5)
    state = GlobalState()
    options = GcsClientOptions.create(
        address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False
    )
    state._initialize_global_state(options)
    free: dict[str, Any] = state.available_resources_per_node()
    placed: dict[str, float] = {}  # node ID -> GPU slots placement groups hold there
    for group in state.placement_group_table().values():
        if group["state"] in ("PREPARED", "CREATED"):  # reserved on its nodes, or made
            for index, node in group["bundles_to_node_id"].items():
                placed[node] = placed.get(node, 0) + group["bundles"][index].get("GPU", 0)
    return {
        n.node_manager_address: {
            "gpus": n.resources_total.get("GPU", 0),
            "free": free.get(node_id.hex(), {}).get("GPU", 0),
            "placed": placed.get(node_id.hex(), 0),
        }
        for node_id, n in nodes.items()
        if n.state == 0
    }


def check_ray(args: argparse.Namespace) -> str | None:
    try:
        nodes = alive_nodes(args.address)
    except Exception as e:  # any failure to read the GCS is "not healthy yet"
        return f"Ray GCS at {args.address} does not answer: {e}"
    missing = [ip for ip in args.expect.split(",") if ip not in nodes]
    if missing:
        seen = ", ".join(sorted(nodes)) or "none"
        return f"Ray nodes missing: {', '.join(missing)} (alive: {seen})"
    gpus = sum(nodes.values())
    if gpus < args.gpus:
        return f"Ray cluster has {gpus:g} GPUs, {args.gpus} expected"
    return None


def print_nodes(args: argparse.Namespace) -> str | None:
    return _printed(alive_nodes, args.address)


def print_slots(args: argparse.Namespace) -> str | None:
    return _printed(gpu_slots, args.address)


def _printed(read: Callable[[str], object], address: str) -> str | None:
    """What `read` finds at the GCS, printed as JSON; or why not."""
    try:
        print(json.dumps(read(address), sort_keys=True))
    except Exception as e:
        return f"Ray GCS at {address} does not answer: {e}"
    return None
