"""A network namespace behind a bridge, for a node that shares nothing with the grid but the
network (:class:`Netns`): the end-to-end test of an agent on a "remote machine".

    with Netns() as net:                      # bridge + veth + namespace, cleaned up on exit
        grid services bind net.host_ip         # devstack.grid.run_grid(bind_host=...)
        net.allow_tcp(scheduler_port, ...)     # the only host ports the namespace may open
        net.call(daemon.start)                 # runs in the namespace (a thread that setns'd)
        ManagedProcess started by net.process  # a child process in the namespace

The layout (names carry a random tag; ``<n>`` is a free 10.231.<n>.0/24 on this host)::

    host: bridge gmb<tag> 10.231.<n>.1/24 ── veth gmv<tag> ══ gmp<tag> 10.231.<n>.2/24 :namespace

* The namespace has only the link route of its /24: no default route, so every address outside
  it (the host's other addresses, 127.0.0.1 of the host, the internet) is "network unreachable",
  and its own 127.0.0.1 is its own loopback. The host does not forward (``ip_forward`` is left as
  it is): the namespace reaches the host's bridge address and nothing behind it.
* On the host, packets coming in from the bridge go to an iptables chain ``GMN-<tag>``: replies
  to the host's own connections pass, new TCP connections pass only to the ports given to
  :meth:`Netns.allow_tcp`, everything else is REJECTed (the namespace sees "connection refused").
* In the namespace, INPUT accepts loopback and replies (conntrack ESTABLISHED,RELATED) and drops
  the rest: like a node behind a NAT, it opens connections and takes none. There is no address
  translation: the host sees the namespace's own address (what a NAT would hide).

Everything is undone on exit, also after a failure half-way. An earlier run that crashed leaves
its namespace, links and chain behind: :func:`remove_leftovers` (called by every start) deletes
those whose creating process is gone (its pid is in the namespace's name; the bridge's alias
``gridmarket-netns pid=<pid>`` says it to a person reading ``ip link``).
Needs root (CAP_NET_ADMIN), iproute2 and iptables; docs/platform.md ("Network namespaces").
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import random
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from ._process import ManagedProcess, ServiceError, pid_alive

__all__ = ["Netns", "NetnsProcess", "ServiceError", "remove_leftovers"]

log = logging.getLogger(__name__)

T = TypeVar("T")

CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns and os.CLONE_NEWNET arrive with Python 3.12
NETNS_DIR = Path("/run/netns")  # where `ip netns add` keeps its handles
SUBNET_PREFIX = "10.231"  # 10.231.<n>.0/24, the first free <n>
_NS_NAME = re.compile(r"^gmn-(?P<pid>\d+)-(?P<tag>[0-9a-f]{6})$")
_LINK_NAME = re.compile(r"^gm[bvp](?P<tag>[0-9a-f]{6})$")
_CHAIN = re.compile(r"^-N GMN-(?P<tag>[0-9a-f]{6})$", re.MULTILINE)

_libc = ctypes.CDLL(None, use_errno=True)


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an ``ip``/``iptables`` command; ServiceError naming it and its stderr on failure."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"`{' '.join(argv)}` could not run: {exc}") from exc
    if check and result.returncode != 0:
        raise ServiceError(
            f"`{' '.join(argv)}` failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result


def _iptables(*args: str, netns: str | None = None, check: bool = True) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    _run([*prefix, "iptables", "-w", "10", *args], check=check)


def _free_subnet() -> int:
    """A ``<n>`` such that no address of this host lies in 10.231.<n>.0/24 (random among the
    free ones, so that two runs starting together rarely pick the same)."""
    used: set[int] = set()
    out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
    for match in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
        addr = ipaddress.ip_address(match.group(1))
        if str(addr).startswith(SUBNET_PREFIX + "."):
            used.add(int(str(addr).split(".")[2]))
    free = [n for n in range(1, 255) if n not in used]
    if not free:
        raise ServiceError(f"no free {SUBNET_PREFIX}.<n>.0/24 on this host")
    return random.choice(free)  # noqa: S311 (not a secret)


def _undo(argv: Sequence[str]) -> None:
    _run(argv)


def remove_leftovers() -> list[str]:
    """Delete the namespaces, bridges, veths and iptables chains that an earlier :class:`Netns`
    left behind when its process died without cleaning up; returns what was removed. Those of
    a running process (other tests, other checkouts) are left alone.

    A :class:`Netns` makes its namespace first, named with its pid, and the rest after: a tag
    whose namespace is gone, or whose namespace's process is dead, is a leftover."""
    removed: list[str] = []
    live: set[str] = set()
    for entry in NETNS_DIR.iterdir() if NETNS_DIR.is_dir() else []:
        m = _NS_NAME.match(entry.name)
        if m is None:
            continue
        if pid_alive(int(m.group("pid"))):
            live.add(m.group("tag"))
        else:
            _run(["ip", "netns", "del", entry.name], check=False)
            removed.append(f"netns {entry.name}")
    sys_net = Path("/sys/class/net")
    for link in sorted(sys_net.iterdir()) if sys_net.is_dir() else []:
        m = _LINK_NAME.match(link.name)
        if m and m.group("tag") not in live and link.exists():  # a veth goes with its peer
            _run(["ip", "link", "del", link.name], check=False)
            removed.append(f"link {link.name}")
    rules = _run(["iptables", "-w", "10", "-S"], check=False).stdout
    for m in _CHAIN.finditer(rules):
        if m.group("tag") in live:
            continue
        chain = m.group(0)[3:]
        _iptables("-D", "INPUT", "-i", f"gmb{m.group('tag')}", "-j", chain, check=False)
        _iptables("-F", chain, check=False)
        _iptables("-X", chain, check=False)
        removed.append(f"iptables chain {chain}")
    for what in removed:
        log.info("removed a leftover of a crashed run: %s", what)
    return removed


class Netns:
    """A network namespace joined to a new bridge by a veth pair; a context manager.

    ``host_ip`` is the bridge's address (where the services the namespace may use listen),
    ``ns_ip`` the namespace's. :meth:`allow_tcp` opens host ports to the namespace; :meth:`call`
    runs a function inside it; :meth:`process` builds a :class:`NetnsProcess` (a
    :class:`~devstack._process.ManagedProcess` started inside it)."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.name = f"gmn-{os.getpid()}-{self.tag}"
        self.bridge = f"gmb{self.tag}"
        self.veth_host = f"gmv{self.tag}"
        self.veth_ns = f"gmp{self.tag}"
        self.chain = f"GMN-{self.tag}"
        self.host_ip = ""
        self.ns_ip = ""
        self.subnet = ""
        self.allowed: list[int] = []
        self._created: list[Callable[[], None]] = []  # undo steps, run in reverse

    @property
    def path(self) -> Path:
        """The namespace's handle (``setns`` opens it; ``nsenter --net=`` takes it)."""
        return NETNS_DIR / self.name

    def __repr__(self) -> str:
        return f"Netns({self.name!r}, host={self.host_ip!r}, ns={self.ns_ip!r})"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        if os.geteuid() != 0:
            raise ServiceError("a network namespace needs root (CAP_NET_ADMIN)")
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                raise ServiceError(f"{tool!r} not found: apt-get install iproute2 iptables")
        remove_leftovers()
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Undo every step taken, last first; errors are logged, not raised (a step may be
        gone already)."""
        while self._created:
            undo = self._created.pop()
            try:
                undo()
            except ServiceError as exc:
                log.warning("netns %s clean-up: %s", self.name, exc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ use

    def allow_tcp(self, ports: Iterable[int]) -> None:
        """Let the namespace open TCP connections to these ports of ``host_ip`` (added before
        the chain's final REJECT)."""
        for port in ports:
            if not 0 < int(port) < 65536:
                raise ValueError(f"bad port {port!r}")
            if port in self.allowed:
                continue
            _iptables(
                "-I", self.chain, "1", "-p", "tcp", "-d", self.host_ip,
                "--dport", str(int(port)), "-j", "ACCEPT",
            )  # fmt: skip
            self.allowed.append(int(port))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread that joined this namespace (``setns`` is per
        thread): its sockets, and the child processes it starts, live in the namespace. Its
        result is returned and its exception raised here."""
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                self._enter()
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=body, name=f"netns {self.name}", daemon=True)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    def process(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> NetnsProcess:
        """A :class:`NetnsProcess` (ManagedProcess's arguments): ``devstack.grid.start_agent``
        takes this as its ``launcher``."""
        return NetnsProcess(self, name, argv, log_path, env=env, cwd=cwd)

    # ------------------------------------------------------------------ steps

    def _enter(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise ServiceError(f"setns({self.path}) failed: {os.strerror(err)}")
        finally:
            os.close(fd)

    def _step(self, do: Sequence[str], undo: Sequence[str]) -> None:
        _run(do)
        self._created.append(lambda: _undo(undo))

    def _drop_chain(self) -> None:
        _iptables("-F", self.chain, check=False)
        _iptables("-X", self.chain)

    def _build(self) -> None:
        n = _free_subnet()
        self.subnet = f"{SUBNET_PREFIX}.{n}.0/24"
        self.host_ip, self.ns_ip = f"{SUBNET_PREFIX}.{n}.1", f"{SUBNET_PREFIX}.{n}.2"
        ns = ["ip", "-n", self.name]
        self._step(["ip", "netns", "add", self.name], ["ip", "netns", "del", self.name])
        self._step(
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "link", "del", self.bridge],
        )
        _run(["ip", "link", "set", self.bridge, "alias", f"gridmarket-netns pid={os.getpid()}"])
        _run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge])
        self._step(
            ["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns],
            ["ip", "link", "del", self.veth_host],  # takes its peer along, wherever it is
        )
        _run(["ip", "link", "set", self.veth_host, "master", self.bridge])
        _run(["ip", "link", "set", self.veth_ns, "netns", self.name])
        _run([*ns, "addr", "add", f"{self.ns_ip}/24", "dev", self.veth_ns])
        for link in ("lo", self.veth_ns):
            _run([*ns, "link", "set", link, "up"])
        for link in (self.bridge, self.veth_host):
            _run(["ip", "link", "set", link, "up"])
        # the host: from the bridge, replies pass, new connections only to allow_tcp's ports
        _iptables("-N", self.chain)
        self._created.append(self._drop_chain)
        _iptables("-A", self.chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                  "-j", "ACCEPT")  # fmt: skip
        _iptables("-A", self.chain, "-j", "REJECT")  # icmp port-unreachable: "refused"
        self._step(
            ["iptables", "-w", "10", "-I", "INPUT", "-i", self.bridge, "-j", self.chain],
            ["iptables", "-w", "10", "-D", "INPUT", "-i", self.bridge, "-j", self.chain],
        )
        # the namespace: takes no connection from outside (as behind a NAT)
        _iptables("-A", "INPUT", "-i", "lo", "-j", "ACCEPT", netns=self.name)
        _iptables("-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                  "-j", "ACCEPT", netns=self.name)  # fmt: skip
        _iptables("-P", "INPUT", "DROP", netns=self.name)
        log.info("network namespace %s: %s <-> %s", self.name, self.host_ip, self.ns_ip)


class NetnsProcess(ManagedProcess):
    """A :class:`~devstack._process.ManagedProcess` whose process runs in a :class:`Netns`
    (started from a thread that joined it); stopping it works from anywhere."""

    def __init__(
        self,
        netns: Netns,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        super().__init__(name, argv, log_path, env=env, cwd=cwd)
        self.netns = netns

    def start(self) -> None:
        self.netns.call(super().start)
