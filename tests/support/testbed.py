"""The multi-node testbed: emulated nodes on one machine, each a network namespace with its own
Docker engine, Docker context, hostname, IPC namespace and /dev/shm, joined by a bridge through an
interface named like the DGX Spark's RoCE port. Containers with `network_mode: host` on a node see
what they would see on a real node.

    python -m tests.support.testbed up [--nodes N]     # prints the contexts; state in /run/vllm-compose-testbed
    python -m tests.support.testbed down

Only the project's own addresses are used: the test subnet lives on a bridge of this machine and the
harness refuses to run unless the kernel routes it there. It ends only processes it started (by the
pid files it wrote).

Not pytest-docker here: its `docker_services` drives one Compose project on one engine, and a
cluster's stacks span several engines over their contexts (tests/test_corpus.py uses it for a
stack on one engine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from python_on_whales import DockerClient

from tests.support import images

SUBNET = "192.168.200"
IFNAME = "enp1s0f1np1"
STATE = Path("/run/vllm-compose-testbed")
ENGINES = Path("/var/lib/vllm-compose-testbed")  # kept between runs: images stay cached
MODELS = "/var/lib/vllm-compose-testbed-models"  # each node sees its own folder at this path
CGROUPS = Path("/sys/fs/cgroup")  # cgroup v1; a pinned node's containers go in one of its own


def sh(*cmd: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        cmd, check=check, text=True, capture_output=True, **kw
    )
    return done


@dataclass
class Node:
    name: str
    ip: str
    netns: str
    context: str
    socket: str
    pidfile: str
    models: str  # the host folder the node sees at MODELS

    @property
    def docker(self) -> DockerClient:
        return DockerClient(context=self.context)

    def inside(self, *cmd: str) -> list[str]:
        """`cmd` as run in the node's network namespace (as a client on the node)."""
        return ["nsenter", f"--net=/var/run/netns/{self.netns}", *cmd]

    def nsexec(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(*self.inside(*cmd), check=check)


@dataclass
class Testbed:
    __test__ = False  # not a test class, despite the name
    prefix: str
    nodes: list[Node] = field(default_factory=list)
    pinned: bool = False  # each node's containers on a core of their own (Testbed.create)
    engines: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    # Building

    @classmethod
    def create(cls, count: int, prefix: str | None = None, pinned: bool = False) -> Testbed:
        """`pinned`: node i's containers run on core i alone (of as many as there are, in turn), as
        on machines of their own: a node's busy start does not take another node's core."""
        prefix = prefix or f"vct{os.getpid() % 10000}"
        bed = cls(prefix, pinned=pinned)
        STATE.mkdir(parents=True, exist_ok=True)
        if (STATE / "testbed.json").exists():
            left = cls.load()
            if left.alive():
                raise RuntimeError(
                    f"a testbed is already up ({STATE}/testbed.json);"
                    " run: python -m tests.support.testbed down"
                )
            print(f"tearing down testbed {left.prefix}: left by a run that ended", flush=True)
            left.destroy()
        try:
            bed._bridge_up()
            for i in range(count):
                bed.nodes.append(bed._node_up(i))
            bed._save()
            for node in bed.nodes:
                bed._wait_engine(node)
            # The engines' data outlives a testbed: a run killed with its engines (or a machine
            # restart) leaves its containers there, and their restart policy starts them again
            # with the new engine, holding the ports and names a test is about to use.
            if kept := bed.remove_containers():
                print(f"removed {kept} container(s) left in the engines by a run that ended")
        except BaseException:
            bed.destroy()
            raise
        return bed

    def _bridge_up(self) -> None:
        taken = sh("ip", "-o", "route", "show", f"{SUBNET}.0/24").stdout.strip()
        if taken:
            raise RuntimeError(f"{SUBNET}.0/24 is already routed ({taken}); is a testbed up?")
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        route = sh("ip", "route", "get", f"{SUBNET}.12").stdout
        if f"dev {self.bridge}" not in route:
            raise RuntimeError(
                f"refusing to run: {SUBNET}.12 is not routed to {self.bridge}: {route}"
            )
        # The root engine sets FORWARD to DROP; let the nodes talk to each other over the bridge.
        sh("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")

    def _node_up(self, i: int) -> Node:
        name = f"spark{i + 1}"
        tag = f"{self.prefix}-{name}"
        node = Node(
            name=name,
            ip=f"{SUBNET}.{12 + i}",
            netns=tag,
            context=tag,
            socket=f"/run/{tag}.sock",
            pidfile=f"/run/{tag}.pid",
            models=str(ENGINES / name / "models"),
        )
        host_end = f"{self.prefix}v{i}"
        sh("ip", "netns", "add", node.netns)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", f"{host_end}p")
        sh("ip", "link", "set", f"{host_end}p", "netns", node.netns)
        sh("ip", "link", "set", host_end, "master", self.bridge, "up")
        node.nsexec("ip", "link", "set", f"{host_end}p", "name", IFNAME)
        node.nsexec("ip", "addr", "add", f"{node.ip}/24", "dev", IFNAME)
        node.nsexec("ip", "link", "set", IFNAME, "up")
        node.nsexec("ip", "link", "set", "lo", "up")
        self._engine_up(node)
        sh("docker", "context", "rm", "-f", node.context, check=False)
        sh("docker", "context", "create", node.context, "--docker", f"host=unix://{node.socket}")
        return node

    def _engine_up(self, node: Node) -> None:
        data = ENGINES / node.name
        Path(node.models).mkdir(parents=True, exist_ok=True)
        Path(MODELS).mkdir(parents=True, exist_ok=True)
        dockerd = (
            f"dockerd --data-root {data}/docker --exec-root /run/{node.netns}-exec"
            f" -H unix://{node.socket} --pidfile {node.pidfile} --bridge none"
            " --iptables=false --ip-masq=false"
        ) + (self._pinned(node) if self.pinned else "")
        # Own mount, IPC and UTS namespaces: a private /dev/shm and hostname per node (vLLM takes
        # two nodes sharing them for one machine), and the node's own model folder.
        script = (
            f"hostname {node.name} && mount -t tmpfs -o size=4g tmpfs /dev/shm"
            f" && mount --bind {node.models} {MODELS}"
            f" && exec nsenter --net=/var/run/netns/{node.netns} {dockerd}"
        )
        log = (STATE / f"{node.netns}.dockerd.log").open("w")
        self.engines[node.name] = subprocess.Popen(
            ["unshare", "-m", "-i", "-u", "--propagation", "private", "sh", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _pinned(self, node: Node) -> str:
        """The engine's flag that puts its containers under a cgroup of the node's own core."""
        cpuset = CGROUPS / "cpuset" / node.netns
        cpuset.mkdir(exist_ok=True)
        core = (int(node.name.removeprefix("spark")) - 1) % (os.cpu_count() or 1)
        (cpuset / "cpuset.cpus").write_text(str(core))
        (cpuset / "cpuset.mems").write_text((CGROUPS / "cpuset" / "cpuset.mems").read_text())
        return f" --cgroup-parent /{node.netns}"

    def _wait_engine(self, node: Node, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while sh("docker", "--context", node.context, "info", check=False).returncode != 0:
            if time.monotonic() > deadline:
                log = (STATE / f"{node.netns}.dockerd.log").read_text()[-2000:]
                raise RuntimeError(f"engine of {node.name} did not answer in {seconds} s:\n{log}")
            time.sleep(0.5)

    def _save(self) -> None:
        data = {"prefix": self.prefix, "nodes": [asdict(n) for n in self.nodes],
                "pinned": self.pinned}  # fmt: skip
        (STATE / "testbed.json").write_text(json.dumps(data, indent=2))

    def alive(self) -> bool:
        """Whether any node's engine still runs (a machine restart or a killed run leaves the
        state file, the namespaces and the bridge, but no engine)."""
        for node in self.nodes:
            with contextlib.suppress(OSError, ValueError):
                pid = int(Path(node.pidfile).read_text())
                if Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd":
                    return True
        return False

    @classmethod
    def load(cls) -> Testbed:
        data = json.loads((STATE / "testbed.json").read_text())
        return cls(data["prefix"], [Node(**n) for n in data["nodes"]], data.get("pinned", False))

    # Images

    def load_image(
        self, image: str, source: DockerClient | None = None, nodes: list[Node] | None = None
    ) -> None:
        """Copy an image from the root engine (or `source`) into every node (or those given) that
        lacks that ID, all at once."""
        source = source or DockerClient()
        wanted = source.image.inspect(image).id
        lacking = []
        for node in nodes or self.nodes:
            with contextlib.suppress(Exception):
                if node.docker.image.inspect(image).id == wanted:
                    continue
            lacking.append(node)
        if lacking:
            print(f"loading {image} into {', '.join(n.name for n in lacking)}", flush=True)
        pipes = []
        for node in lacking:
            save = subprocess.Popen(
                [*source.client_config.docker_cmd, "save", image], stdout=subprocess.PIPE
            )
            load = subprocess.Popen(
                ["docker", "--context", node.context, "load", "-q"],
                stdin=save.stdout,
                stdout=subprocess.DEVNULL,
            )
            assert save.stdout is not None
            save.stdout.close()  # the load owns the pipe now
            pipes.append((node, save, load))
        for node, save, load in pipes:
            if load.wait() != 0 or save.wait() != 0:
                raise RuntimeError(f"loading {image} into {node.name} failed")

    # Faults

    def stop_engine(self, node: Node) -> None:
        self._signal_engine(node, signal.SIGTERM, wait=True)

    def power_cut(self, nodes: list[Node]) -> None:
        """The nodes lose power at once: their engines and every process of their containers
        killed (SIGKILL, nothing stops gracefully); the engines are not started again."""
        pids = []
        for node in nodes:
            ids = sh("docker", "--context", node.context, "ps", "-q").stdout.split()
            if ids:
                found = sh("docker", "--context", node.context, "inspect", "-f",
                           "{{.State.Pid}}", *ids).stdout.split()  # fmt: skip
                pids += [int(pid) for pid in found if pid != "0"]
        for node in nodes:  # first the engines, which would restart what dies below
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(Path(node.pidfile).read_text()), signal.SIGKILL)
        for node in nodes:  # and the engine's containerd, which outlives a killed dockerd
            with contextlib.suppress(OSError, ValueError):
                containerd = Path(f"/run/{node.netns}-exec/containerd/containerd.pid")
                pids.append(int(containerd.read_text()))
        for pid in pids:  # each container's init: the kernel kills the rest of its namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in nodes:
            self._signal_engine(node, signal.SIGKILL, wait=True)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)

    def start_engine(self, node: Node) -> None:
        self._engine_up(node)
        self._wait_engine(node)

    @contextlib.contextmanager
    def controller_cut_off(self, node: Node) -> Iterator[None]:
        """This machine loses its path to the node's engine (a context that no longer answers:
        ssh down, a VPN gone) while the node and its containers run on: its socket file moved
        aside for the block (the engine keeps serving the socket it holds)."""
        socket = Path(node.socket)
        aside = socket.rename(f"{node.socket}.cut")
        try:
            yield
        finally:
            aside.rename(socket)

    def link_down(self, node: Node) -> None:
        node.nsexec("ip", "link", "set", IFNAME, "down")

    def link_up(self, node: Node) -> None:
        node.nsexec("ip", "link", "set", IFNAME, "up")

    def drop(self, node: Node, peer_ip: str) -> None:
        """Drop everything `node` receives from `peer_ip`."""
        node.nsexec("iptables", "-I", "INPUT", "-s", peer_ip, "-j", "DROP")

    def add_external_default_route(self, node: Node, ip: str = "198.51.100.2") -> None:
        """A second, "external" address that is the node's default route and that no other node can
        reach: what Ray picks without --node-ip-address. A veth pair with both ends inside the
        node (no dummy driver here): nothing sent that way leaves the node."""
        node.nsexec("ip", "link", "add", "ext0", "type", "veth", "peer", "name", "ext0p")
        node.nsexec("ip", "addr", "add", f"{ip}/24", "dev", "ext0")
        node.nsexec("ip", "link", "set", "ext0", "up")
        node.nsexec("ip", "link", "set", "ext0p", "up")
        node.nsexec("ip", "route", "add", "default", "via", "198.51.100.1", "dev", "ext0")

    def remove_external_default_route(self, node: Node) -> None:
        node.nsexec("ip", "link", "del", "ext0", check=False)

    @contextlib.contextmanager
    def external_default_route(self, node: Node) -> Iterator[None]:
        self.add_external_default_route(node)
        try:
            yield
        finally:
            self.remove_external_default_route(node)

    @contextlib.contextmanager
    def renamed_interface(self, node: Node, name: str) -> Iterator[None]:
        """The node's private-link interface under another name for the block (real nodes name
        their ports differently: the DGX Spark's twins are enp1s0f1np1 and enP2p1s0f1np1). Its
        address stays; the kernel restores the subnet's route when the link comes back up."""
        self._rename(node, IFNAME, name)
        try:
            yield
        finally:
            self._rename(node, name, IFNAME)

    def _rename(self, node: Node, old: str, new: str) -> None:
        node.nsexec("ip", "link", "set", old, "down")
        node.nsexec("ip", "link", "set", old, "name", new)
        node.nsexec("ip", "link", "set", new, "up")

    def undrop(self, node: Node, peer_ip: str) -> None:
        node.nsexec("iptables", "-D", "INPUT", "-s", peer_ip, "-j", "DROP", check=False)

    # Real ssh:// contexts, as users reach real nodes

    def ssh_context(self, node: Node) -> str:
        """An sshd inside the node's namespace on <ip>:22 whose sessions talk to the node's engine,
        and a Docker context `ssh://root@<ip>` that reaches it. Returns the context's name."""
        keys = STATE / "ssh"
        keys.mkdir(mode=0o700, exist_ok=True)
        if not (keys / "client").exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "client"))
        host_key = keys / f"{node.name}-host"
        if not host_key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
        (keys / "authorized_keys").chmod(0o600)
        sshd_config = keys / f"{node.name}-sshd_config"
        sshd_config.write_text(
            f"ListenAddress {node.ip}:22\nHostKey {host_key}\nPidFile {keys}/{node.name}-sshd.pid\n"
            f"PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            f"AuthorizedKeysFile {keys}/authorized_keys\nStrictModes no\n"
            f"SetEnv DOCKER_HOST=unix://{node.socket}\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        node.nsexec("/usr/sbin/sshd", "-f", str(sshd_config))
        self._ssh_client_config(node, keys)
        context = f"{node.context}-ssh"
        sh("docker", "context", "rm", "-f", context, check=False)
        sh("docker", "context", "create", context, "--docker", f"host=ssh://root@{node.ip}")
        return context

    def _ssh_client_config(self, node: Node, keys: Path) -> None:
        """A marked block in ~/.ssh/config (Docker's ssh transport reads only that); removed on
        destroy."""
        config = Path.home() / ".ssh" / "config"
        config.parent.mkdir(mode=0o700, exist_ok=True)
        block = (
            f"{self._marker(node)}\nHost {node.ip}\n  IdentityFile {keys}/client\n"
            f"  UserKnownHostsFile {keys}/known_hosts\n  StrictHostKeyChecking accept-new\n"
            f"  ConnectTimeout 5\n{self._marker(node)}\n"
        )
        old = config.read_text() if config.exists() else ""
        config.write_text(old + block)

    def _marker(self, node: Node) -> str:
        return f"# vllm-compose testbed {node.context}"

    def _ssh_down(self, node: Node) -> None:
        pidfile = STATE / "ssh" / f"{node.name}-sshd.pid"
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        sh("docker", "context", "rm", "-f", f"{node.context}-ssh", check=False)
        config = Path.home() / ".ssh" / "config"
        if config.exists():
            text, marker = config.read_text(), self._marker(node)
            while marker in text:
                start = text.index(marker)
                end = text.index(marker, start + len(marker)) + len(marker) + 1
                text = text[:start] + text[end:]
            config.write_text(text)

    @contextlib.contextmanager
    def listening(self, node: Node, port: int, image: str) -> Iterator[None]:
        """Something else listening on the node's IP:port for the block (`image` needs python3)."""
        squatter = node.docker.run(
            image,
            ["python3", "-m", "http.server", str(port), "--bind", node.ip],
            detach=True,
            networks=["host"],
            remove=True,
        )
        try:
            yield
        finally:
            squatter.remove(force=True)

    def shm_size(self, node: Node, size: str) -> None:
        """Resize the node's own /dev/shm (in its engine's mount namespace), e.g. "64m"."""
        pid = Path(node.pidfile).read_text().strip()
        sh("nsenter", "-t", pid, "-m", "mount", "-o", f"remount,size={size}", "/dev/shm")

    def remove_path(self, node: Node, relative: str) -> None:
        """Remove a file or folder under the node's own MODELS folder."""
        path = Path(node.models) / relative
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    # Tearing down

    def _signal_engine(self, node: Node, sig: int, wait: bool) -> None:
        try:
            pid = int(Path(node.pidfile).read_text())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        ours = self.engines.get(node.name)  # a child of ours: /proc keeps it until reaped

        def alive() -> bool:
            return ours.poll() is None if ours else Path(f"/proc/{pid}").exists()

        deadline = time.monotonic() + 60  # its containers get 30 s to stop
        while wait and alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node.name in self.engines:
            self.engines.pop(node.name).wait(timeout=30)

    def remove_containers(self) -> int:
        """Every container and named volume on the nodes' engines (their images stay: the
        engines' data outlives a testbed, and a volume left there would outlive it too); returns
        how many containers there were."""
        count = 0
        for node in self.nodes:
            ids = sh("docker", "--context", node.context, "ps", "-aq", check=False).stdout.split()
            count += len(ids)
            if ids:
                sh("docker", "--context", node.context, "rm", "-f", "-v", *ids, check=False)
            names = sh("docker", "--context", node.context, "volume", "ls", "-q").stdout.split()
            if names:  # the nodes' engines speak API 1.41: no `volume prune --all`
                sh("docker", "--context", node.context, "volume", "rm", "-f", *names, check=False)
        return count

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.remove_containers()
        for node in self.nodes:  # all at once: each engine takes seconds to stop
            self._signal_engine(node, signal.SIGTERM, wait=False)
        for node in self.nodes:
            self._ssh_down(node)
            self._signal_engine(node, signal.SIGTERM, wait=True)
            sh("docker", "context", "rm", "-f", node.context, check=False)
            sh("ip", "netns", "del", node.netns, check=False)
            (STATE / f"{node.netns}.dockerd.log").unlink(missing_ok=True)
            for controller in CGROUPS.glob(f"*/{node.netns}"):  # a pinned node's, emptied
                with contextlib.suppress(OSError):  # with its containers
                    controller.rmdir()
        sh(
            "iptables",
            "-D",
            "FORWARD",
            "-i",
            self.bridge,
            "-o",
            self.bridge,
            "-j",
            "ACCEPT",
            check=False,
        )
        sh("ip", "link", "del", self.bridge, check=False)
        (STATE / "testbed.json").unlink(missing_ok=True)


def with_door(bed: Testbed) -> Testbed:
    """Every node holds the front door's image (Debian's HAProxy: the configs that
    tests/support/clusters.py writes name it), as a node that pulled it would."""
    try:
        bed.load_image(images.haproxy_image(DockerClient()))
    except BaseException:
        bed.destroy()
        raise
    return bed


@contextlib.contextmanager
def running(count: int, pinned: bool = False) -> Iterator[Testbed]:
    """A testbed of `count` nodes for the block, each holding the front door's image."""
    bed = with_door(Testbed.create(count, pinned=pinned))
    try:
        yield bed
    finally:
        bed.destroy()


@contextlib.contextmanager
def borrowed(count: int) -> Iterator[Testbed]:
    """The testbed that is up (left up after), else one of `count` nodes made for the block."""
    if (STATE / "testbed.json").exists() and Testbed.load().alive():
        yield Testbed.load()
        return
    with running(count) as bed:
        yield bed


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.testbed")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    if args.action == "down":
        if (STATE / "testbed.json").exists():
            Testbed.load().destroy()
        print("testbed down")
        return
    bed = with_door(Testbed.create(args.nodes))
    for node in bed.nodes:
        print(f"{node.name}: {node.ip} on {IFNAME}, context {node.context}")


if __name__ == "__main__":
    main()
