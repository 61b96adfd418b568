"""Several hosts on one machine: each in its own network namespace, on one bridge, with its own
address and host name (every host resolves every other by name), its link shaped with
``tc tbf`` in both directions.

``ip netns exec NS`` runs a command on a host: it sees only that host's interface and its
own loopback, and ``/etc/netns/NS/hosts`` as ``/etc/hosts``. The file system is shared, as
if every host had the same folders mounted: what a host may read is the deployment's
business (containers test that part, ``tests/containers``).

Needs root, iproute2 and, where a Docker daemon set ``br_netfilter`` (bridged traffic goes
through iptables' FORWARD chain, whose policy Docker sets to DROP), iptables: the bridge's
own traffic is accepted for as long as the hosts exist. Everything made is removed on exit,
and stale namespaces of the same ``tag`` (a run killed before its clean-up) on entry.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Host", "Hosts", "can_make_hosts"]

_NETNS_ETC = Path("/etc/netns")


def can_make_hosts() -> str | None:
    """Why namespaced hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: apt-get install iproute2)"
    return None


@dataclass(frozen=True)
class Host:
    """One host: its name (resolvable from every host), address, namespace and link."""

    name: str
    address: str
    namespace: str
    veth: str  # the bridge's end of its link (what the host receives leaves through it)
    rate: str | None  # tbf rate each way (``100mbit``), None: unshaped

    @property
    def bytes_per_second(self) -> float | None:
        """Its link's rate each way in bytes per second (None: unshaped)."""
        return None if self.rate is None else _bits_per_second(self.rate) / 8

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def link_bytes(self) -> tuple[int, int]:
        """(bytes received, bytes sent) by this host over its link so far."""
        stats = Path("/sys/class/net") / self.veth / "statistics"
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _tbf(rate: str) -> list[str]:
    """A token bucket for ``rate``: a burst of 10 ms of it (at least 32 KiB), 100 ms of queue."""
    bits = _bits_per_second(rate)
    burst = max(32 * 1024, bits // 8 // 100)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]


def _bits_per_second(rate: str) -> int:
    """``100mbit`` → 100_000_000 (tc's units: kbit, mbit, gbit)."""
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[: -len(unit)]) * scale)
    raise ValueError(f"rate {rate!r}: give it in bit, kbit, mbit or gbit")


class Hosts:
    """Hosts named by ``links`` (name → tbf rate, or None for an unshaped link), numbered in
    order on ``subnet``; a context manager that makes them and removes them."""

    def __init__(self, links: Mapping[str, str | None], *, tag: str = "fsh", subnet: str = "10.231.0.0/24") -> None:
        net = ipaddress.ip_network(subnet)
        if len(links) > net.num_addresses - 3:
            raise ValueError(f"{len(links)} hosts do not fit in {subnet}")
        self.tag = tag
        self.bridge = f"{tag}br"
        self.prefix = net.prefixlen
        self.hosts = {
            name: Host(name, str(net[i + 2]), f"{tag}-{name}", f"{tag}v{i}", rate)
            for i, (name, rate) in enumerate(links.items())
        }
        self._accepting = False

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Hosts:
        self.remove()  # a run killed before its clean-up
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _make(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() and shutil.which("iptables"):
            _run("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
            self._accepting = True
        names = "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for host in self.hosts.values():
            inner = f"{self.tag}i"
            _run("ip", "netns", "add", host.namespace)
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", host.namespace)
            _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
            on_host = ("ip", "netns", "exec", host.namespace)
            _run(*on_host, "ip", "link", "set", inner, "name", "eth0")
            _run(*on_host, "ip", "addr", "add", f"{host.address}/{self.prefix}", "dev", "eth0")
            _run(*on_host, "ip", "link", "set", "eth0", "up")
            _run(*on_host, "ip", "link", "set", "lo", "up")
            if host.rate is not None:  # both ways: into the host (bridge side) and out of it
                _run("tc", "qdisc", "add", "dev", host.veth, "root", *_tbf(host.rate))
                _run(*on_host, "tc", "qdisc", "add", "dev", "eth0", "root", *_tbf(host.rate))
            etc = _NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")

    def cut(self, a: str, b: str) -> None:
        """Drop every packet from host ``a`` to host ``b`` (a firewall between them)."""
        _run(*self.hosts[a].command(["iptables", "-A", "OUTPUT", "-d", self.hosts[b].address, "-j", "DROP"]))

    def mend(self, a: str, b: str) -> None:
        """Undo :meth:`cut`."""
        _run(*self.hosts[a].command(["iptables", "-D", "OUTPUT", "-d", self.hosts[b].address, "-j", "DROP"]))

    def remove(self) -> None:
        """Stop every process left on the hosts and remove the namespaces, links, bridge and names."""
        listed = _run("ip", "netns", "list", check=False).stdout.split()
        for namespace in [n for n in listed if n.startswith(f"{self.tag}-")]:
            pids = _run("ip", "netns", "pids", namespace, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            if pids:
                time.sleep(0.2)
            _run("ip", "netns", "delete", namespace, check=False)  # its end of the veth goes with it
            shutil.rmtree(_NETNS_ETC / namespace, ignore_errors=True)
        _run("ip", "link", "delete", self.bridge, check=False)
        if self._accepting:
            _run("iptables", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT", check=False)
            self._accepting = False
