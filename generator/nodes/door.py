"""The front door on the head's engine: kept running while its group goes down and comes back
(a request it holds is answered by the group that comes back), told to read its keys again, told
of every model behind a front door on its node, and asked as a client would once it started."""

from __future__ import annotations

import time
from collections.abc import Callable

from python_on_whales import Container, DockerClient, DockerException
from python_on_whales.utils import run

from generator.base import probes
from generator.base.errors import DockerError, PhaseError, VllmComposeError, reason
from generator.base.fanout import each
from generator.config import Node
from generator.nodes import doorlocal, secrets
from generator.nodes.fleet import DOWN_TIMEOUT, Fleet
from generator.stack import SECRET_NAMES, claims, doorfiles, monitoring, secrets_folder

NAME = "front-door"  # its service (stack/frontdoor.py)
LOG_TAIL = 20  # of its log, in the error when it does not answer
ASKED = 3  # times `answers` asks, a second apart, before it says the door does not answer


def group_down(
    fleet: Fleet, nodes: list[Node] | None = None, stop: int | None = None
) -> dict[str, str]:
    """Like Fleet.down without volumes, but the front door stays: every other service of each
    node (or those given) stopped (`stop`: seconds after SIGTERM) and removed, all nodes at once;
    node -> 'removed' ('removed, the front door kept' on the head) or why it is not clean."""

    def one(node: Node) -> Callable[[], object]:
        stack = fleet.stacks[node.name]
        names = [s.name for s in stack.services] + [s.name for s in stack.sidecars]
        names = [n for n in names if n != NAME]
        docker = fleet.docker[node.name]

        def run() -> None:
            docker.compose.stop(names, timeout=stop)
            docker.compose.rm(names, stop=True)

        return run

    chosen = fleet.cluster.nodes if nodes is None else nodes
    outcome = each({n.name: one(n) for n in chosen}, DOWN_TIMEOUT)
    kept = fleet.head.name if fleet.cluster.front_door.enabled else None
    return {
        name: f"failed: {reason(found)}"
        if isinstance(found, BaseException)
        else "removed, the front door kept"
        if name == kept
        else "removed"
        for name, found in outcome.items()
    }


def reload(fleet: Fleet) -> None:
    """The head's front door reads its files again (`_reload`)."""
    docker = fleet.docker[fleet.head.name]
    for container in docker.compose.ps(services=[NAME]):
        _reload(docker, container)


def _reload(docker: DockerClient, container: Container) -> None:
    """HAProxy's master (the container's first process) reloads on SIGUSR2: a new worker with
    the files read again, the old one finishing what it holds (nothing in flight is dropped).
    Sent from inside: a signal through `docker kill` marks the container as stopped by hand,
    and its restart policy would not start it again after a reboot."""
    docker.container.execute(container, ["sh", "-c", "kill -USR2 1"])


def routed(fleet: Fleet) -> None:
    """Every front door running on the cluster's nodes (every cluster's whose head is one of
    them) given the routes to every model behind one there, and reloaded: each door's port
    serves them all. A door on another node is reached at its endpoint with this door's key,
    which every door there lets in (the peers' map: each door's own line read from its node).
    What a door learnt of doors on other nodes from another cluster's `up` is kept
    (doorfiles.merged). Run after an `up` started the door and after a `down`; a failure is
    said, not raised (each door still serves its own model)."""
    try:
        doors = {
            n.name: fleet.docker[n.name].container.list(filters=[("label", DOOR_LABEL)])
            for n in fleet.cluster.nodes
        }
        found = claims.found(doors)  # cluster -> its claim
        door_of = {_cluster(c): c for listed in doors.values() for c in listed}
        at = {  # cluster -> its door's node, for each that routes (labels of this version)
            cluster: node
            for node, listed in doors.items()
            for cluster in (_cluster(c) for c in listed)
            if found[cluster].route
        }
        known = {c: _known(fleet, node, c) for c, node in at.items()}
        peers = _peers(fleet, at, known)
        looked_at = {str(n.ip) for n in fleet.cluster.nodes}
        gone = None if fleet.cluster.name in at else fleet.cluster.name
        for cluster, node in at.items():
            routes = [_route(found[other], node == there) for other, there in at.items()]
            now = doorfiles.merged(known[cluster], doorfiles.Known(routes, peers), looked_at, gone)
            files = doorfiles.route_files(now.routes, now.peers)
            docker = fleet.docker[node]
            secrets.write(docker, node, cluster, fleet.wrapper, _encoded(files))
            _reload(docker, door_of[cluster])
    except (DockerException, VllmComposeError) as e:  # said: each door keeps its routes
        fleet.report(f"front door: the routes were not written: {reason(e)}")
        return
    fleet.report(_routed(fleet, found, at))


def _routed(fleet: Fleet, found: dict[str, claims.Claim], at: dict[str, str]) -> str:
    """What `routed` did: the models behind the doors routed, and their nodes."""
    if not at:
        return f"front door: none left on {', '.join(n.name for n in fleet.cluster.nodes)}"
    models = ", ".join(sorted(found[c].model for c in at))
    nodes = ", ".join(sorted(set(at.values())))
    return f"front door: {len(at)} model(s) behind the doors on {nodes}: {models}"


DOOR_LABEL = f"{claims.PREFIX}service={NAME}"
KNOWN = ["front_door_routes", "front_door_peers"]  # what a door knows of the others, on its node


def _cluster(container: Container) -> str:
    return (container.config.labels or {})[claims.CLUSTER]


def _encoded(files: dict[str, str]) -> dict[str, bytes]:
    return {name: text.encode() for name, text in files.items()}


def _known(fleet: Fleet, node: str, cluster: str) -> doorfiles.Known:
    """The routes and peers a door's folder on its node holds now."""
    files = _read(fleet.docker[node], node, cluster, fleet.wrapper, KNOWN)
    routes, peers = (files.get(name, "") for name in KNOWN)
    return doorfiles.Known(doorfiles.read_routes(routes), doorfiles.read_peers(peers))


def _read(
    docker: DockerClient, node: str, cluster: str, image: str, names: list[str]
) -> dict[str, str]:
    """Files of the cluster's on the node that are no secret (a front door's routes and peers'
    map: models, ports, hashes and names), read in one short-lived container; name -> its text,
    empty where there is none."""
    reader = ["run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "sh"]
    files = " ".join(SECRET_NAMES[name] for name in names)
    script = f"for f in {files}; do cat /s/$f 2>/dev/null; printf '\\0'; done"
    volume = ["-v", f"{secrets_folder(cluster)}:/s:ro"]
    try:
        said = str(run([*docker.client_config.docker_cmd, *reader, *volume, image, "-c", script]))
    except DockerException as e:
        raise DockerError.wrap(node, f"reading the {', '.join(names)} files failed", e) from None
    return dict(zip(names, said.split("\0"), strict=False))


def _route(claim: claims.Claim, here: bool) -> doorfiles.Route:
    """To a cluster's vLLM on this node's loopback, or to its door on another node."""
    model, port = claim.route or ("", 0)
    host, door = claim.door
    return doorfiles.Route(model, port) if here else doorfiles.Route(model, door, host)


def _peers(fleet: Fleet, at: dict[str, str], known: dict[str, doorfiles.Known]) -> dict[str, str]:
    """cluster -> the hash of its door's key, for every door routed: this cluster's from its
    file beside the config, every other's from its own line in its peers' map on its node
    (which its `up` wrote)."""
    peers = {c: known[c].peers[c] for c in at if c in known[c].peers}
    own = doorlocal.peer_hash(fleet.secret_files)
    if fleet.cluster.name in at and own:
        peers[fleet.cluster.name] = own
    return peers


def opened(fleet: Fleet, start: Callable[[str, dict[Node, list[str]]], None]) -> None:
    """`up`'s front door phase: the door started (`start`: up's, phase -> node -> services),
    every door on its node routed and reloaded (so this one reads its keys again too: `up`
    reloads it once), then this one asked."""
    start("front door", {fleet.head: [NAME]})
    routed(fleet)
    answers(fleet)


def answers(fleet: Fleet) -> None:
    """The door answers on its port as a client would ask: /v1/models with the admin key, from a
    one-off container of the wrapper on the head's network, the key mounted read-only where serve
    has it (root's, mode 0600: read as root). The door answers that itself, so this runs before
    vLLM starts: a door that cannot start (its port held, an image too old for its
    configuration) or cannot read its keys or routes fails `up` in seconds, with its log, not at
    a client's first request after the model's load."""
    c, head = fleet.cluster, fleet.head
    key = f"{secrets_folder(c.name)}/{SECRET_NAMES['api_key']}"
    options = {"networks": ["host"], "user": "0", "volumes": [(key, monitoring.API_KEY_FILE, "ro")]}
    for _ in range(ASKED):  # the worker before a reload may answer the first: with the old keys
        try:
            listed = fleet.one_off(head, probes.models(c.vllm.port), **options)
            problem = None if c.served_model_name in listed else f"it lists {sorted(listed)}"
        except DockerError as e:
            problem = e.what
        if not problem:
            break
        time.sleep(1)
    if problem:
        said = f"the front door does not answer for {c.served_model_name} on port {c.vllm.port}"
        tail = f"last lines of {NAME} on {head.name}:\n{fleet.tail(head, NAME, LOG_TAIL)}"
        hint = f"its log says why; `vllm-compose logs CONFIG --node {head.name}` shows all of it"
        raise PhaseError(head.name, "front door", f"{said}: {problem}", tail, hint)
    fleet.report(f"front door: {head.name}: answers on port {c.vllm.port}")
