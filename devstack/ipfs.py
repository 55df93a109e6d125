"""Start and stop local js-ipfs daemons (npm ``ipfs@0.66.1``) speaking the Kubo RPC API.

One offline daemon (the default)::

    with IpfsDaemon(work_dir).start() as ipfs:
        storage = AgentIpfsStore(ipfs.api_addr)

Several daemons that move content between them over a loopback swarm (bitswap)::

    with IpfsSwarm(work_dir, ["scheduler", "agent-1"]) as swarm:  # started, fully connected
        cid = add_on(swarm["agent-1"].api_addr)
        fetch_from(swarm["scheduler"].api_addr, cid)  # the bytes cross the swarm

The repository lives in ``<work_dir>/repo`` (initialised once, reused by later starts), the log in
``<work_dir>/ipfs.log``. Every daemon listens on 127.0.0.1 only, on ports the OS picks, with no
bootstrap peers, no routing (no DHT), no MDNS and no preload nodes: nothing leaves the machine.
An offline daemon has no swarm at all; a swarm daemon (``swarm=True``) listens for peers on a
loopback TCP port (or on ``swarm_host``, e.g. a bridge address that other network namespaces
reach: the API stays on loopback) and talks only to the peers it is told to
:meth:`IpfsDaemon.connect` to; it runs from an overlay ``<work_dir>/node_modules`` (symlinks)
that works around a dependency split in the locked tree (``_OVERLAY`` below). Pitfalls behind
each step are in docs/platform.md ("IPFS and Docker", "IPFS swarm on loopback").
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from devstack._process import (
    ROOT,
    ManagedProcess,
    Service,
    ServiceError,
    clear_stale_pidfile,
    log_tail,
)

__all__ = ["IpfsDaemon", "IpfsSwarm", "ServiceError"]

_LOCALHOST_ANY_PORT = "/ip4/127.0.0.1/tcp/0"
_STABLE_PORTS_FROM = 20_000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (and to ``bind(0)``)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def stable_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` below the kernel's ephemeral range. A daemon restarted on
    the ports of its first start (``keep_ports``) must find them free again; a port the OS
    picked (``bind(0)``) is in the ephemeral range, from which every outgoing connection on the
    machine also takes its local port, so while the daemon is down one of them can hold it
    (seen: ``listen EADDRINUSE`` on the restart of an agent's node). Below that range only an
    explicit bind can take it."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(_STABLE_PORTS_FROM, max(_STABLE_PORTS_FROM + 1, low))
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ServiceError(f"no free TCP port on {host} in {_STABLE_PORTS_FROM}..{low - 1}")


# js-ipfs 0.66.1's libp2p 0.42 builds multiaddrs with @multiformats/multiaddr 11, but the locked
# @libp2p/tcp 6.2.2 and @libp2p/websockets 5.0.10 (and their mafmt 12) resolve the hoisted
# multiaddr 12, which does not recognise a version-11 object: every listen address is filtered
# out and the daemon hangs in start-up ("no valid addresses were provided for transports").
# A swarm daemon therefore runs from an overlay node_modules in its work dir: one symlink per
# package of the real tree, except the hoisted multiaddr, which points at libp2p's own copy;
# `node --preserve-symlinks` resolves every import inside the overlay (docs/platform.md).
_OVERLAY = "node_modules"


def _package_version(package_dir: Path) -> str | None:
    try:
        return str(json.loads((package_dir / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


class IpfsDaemon(Service):
    """A js-ipfs daemon owned by this process; a context manager (``stop`` on exit).

    ``swarm=False`` (the default): ``daemon --offline``, no swarm listener, the node talks to
    nobody. ``swarm=True``: the daemon runs online with a swarm listener on 127.0.0.1 (a TCP
    port the OS picks; with ``websockets=True`` also a WebSocket one) and no way to find peers by
    itself: :meth:`connect` dials another daemon, after which bitswap moves blocks between them.
    ``keep_ports=True``: the API (and swarm) ports are picked once, below the kernel's ephemeral
    range (:func:`stable_port`: no outgoing connection can hold them while the daemon is down),
    and every start asks for them, so clients and peers configured with those addresses reach
    the daemon again after a restart.
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        node_modules: Path = ROOT / "node_modules",
        polyfills: Path = ROOT / "tools" / "node-polyfills.cjs",
        node: str = "node",
        start_timeout: float = 60.0,
        swarm: bool = False,
        websockets: bool = False,
        keep_ports: bool = False,
        name: str = "",
        swarm_host: str = "127.0.0.1",
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.repo = self.work_dir / "repo"
        self.log_path = self.work_dir / "ipfs.log"
        self.node_modules = node_modules
        self.cli = node_modules / "ipfs" / "src" / "cli.js"
        self.polyfills = polyfills
        self.node = node
        self.start_timeout = start_timeout
        self.swarm = swarm
        self.websockets = websockets
        self.keep_ports = keep_ports
        self.name = name or self.work_dir.name
        self.swarm_host = swarm_host
        """The IPv4 address the swarm listens on (the API and gateway stay on 127.0.0.1)."""
        self._pidfile = self.work_dir / "ipfs.pid"
        self.api_addr = ""
        """Multiaddr of the RPC API, e.g. ``/ip4/127.0.0.1/tcp/41234/http`` (ipfshttpclient)."""
        self.api_url = ""
        """Base URL of the RPC API, e.g. ``http://127.0.0.1:41234``."""
        self.peer_id = ""
        """The node's libp2p peer id (``12D3KooW...``, Ed25519), known once the repo exists."""
        self.swarm_addr = ""
        """Swarm mode: the TCP address peers dial, ``/ip4/<swarm_host>/tcp/PORT/p2p/<peer_id>``."""
        self.ws_addr = ""
        """Swarm mode with ``websockets=True``: ``/ip4/127.0.0.1/tcp/PORT/ws/p2p/<peer_id>``."""
        self._ports: dict[str, int] = {}  # keep_ports: "api", "tcp", "ws" of the first start

    def __repr__(self) -> str:
        return f"IpfsDaemon({self.name!r}, api={self.api_addr!r}, swarm={self.swarm_addr!r})"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        if self._proc is not None:
            return self
        node = shutil.which(self.node)
        if node is None:
            raise ServiceError(f"{self.node!r} not found: js-ipfs needs Node.js 18 or newer")
        if not self.cli.is_file():
            raise ServiceError(f"js-ipfs is not installed ({self.cli} missing): run `npm ci`")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._clear_stale_state()
        env = self._env()
        if not (self.repo / "config").is_file():
            self._init(node, env)
        if self.keep_ports and not self._ports:  # fixed now: a restart asks for them again
            self._ports = {"api": stable_port()}
            if self.swarm:
                self._ports["tcp"] = stable_port(self.swarm_host)
                if self.websockets:
                    self._ports["ws"] = stable_port(self.swarm_host)
        self._configure()
        argv = [node, str(self.cli), "daemon", "--offline", "--enable-preload=false"]
        if self.swarm:
            overlay = self._overlay()
            cli = str(overlay / "ipfs" / "src" / "cli.js") if overlay else str(self.cli)
            flags = ["--preserve-symlinks", "--preserve-symlinks-main"] if overlay else []
            argv = [node, *flags, cli, "daemon", "--enable-preload=false"]
        proc = ManagedProcess("js-ipfs daemon", argv, self.log_path, env=env, cwd=self.work_dir)
        self._launch(
            proc, self._ready, self.start_timeout, lambda pid: self._pidfile.write_text(str(pid))
        )
        return self

    def stop(self) -> None:
        super().stop()
        self._pidfile.unlink(missing_ok=True)
        (self.repo / "api").unlink(missing_ok=True)

    # ------------------------------------------------------------------ swarm

    def connect(self, other: IpfsDaemon | str, timeout: float = 15.0) -> None:
        """Dial a peer: another running swarm daemon, or its multiaddr (``.../p2p/<id>``).

        The connection is both ways (either side's bitswap asks the other for blocks); it lasts
        until one side stops (the daemons do not redial on their own). A dial js-ipfs refuses
        (``All promises were rejected``: a peer just restarted, or a loaded machine) is tried
        again every half second until ``timeout``. ServiceError on failure.
        """
        addr = other.swarm_addr if isinstance(other, IpfsDaemon) else other
        if not self.swarm:
            raise ServiceError(f"{self.name}: an offline daemon (swarm=False) cannot connect")
        if not addr:
            raise ServiceError(f"{self.name}: {other!r} has no swarm address (not started?)")
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = self.rpc(
                    "swarm/connect", addr, timeout=max(1.0, deadline - time.monotonic())
                )
                break
            except ServiceError as exc:
                if time.monotonic() + 0.5 >= deadline or "HTTP 500" not in str(exc):
                    raise ServiceError(f"{self.name}: swarm connect {addr} failed: {exc}") from exc
                time.sleep(0.5)
        strings = answer.get("Strings") or []
        if not any("success" in s for s in strings):
            raise ServiceError(f"{self.name}: swarm connect {addr} answered {answer}")

    def disconnect(self, other: IpfsDaemon | str, timeout: float = 15.0) -> None:
        """Close the connection to a peer (a daemon or its multiaddr); ServiceError on failure."""
        addr = other.swarm_addr if isinstance(other, IpfsDaemon) else other
        try:
            self.rpc("swarm/disconnect", addr, timeout=timeout)
        except ServiceError as exc:
            raise ServiceError(f"{self.name}: swarm disconnect {addr} failed: {exc}") from exc

    def peers(self) -> set[str]:
        """Peer ids this daemon is connected to now (``swarm/peers``)."""
        answer = self.rpc("swarm/peers")
        return {p["Peer"] for p in answer.get("Peers") or []}

    def rpc(self, command: str, *args: str, timeout: float = 10.0, **opts: str) -> Any:
        """POST ``/api/v0/<command>?arg=...`` to the running daemon; the decoded JSON answer
        (a list when it streams several JSON lines, ``{}`` when it answers nothing).

        ServiceError with the daemon's message on an error answer or no answer."""
        if not self.api_url:
            raise ServiceError(f"{self.name}: the daemon is not running")
        query = urllib.parse.urlencode([("arg", a) for a in args] + list(opts.items()))
        url = f"{self.api_url}/api/v0/{command}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, method="POST")  # noqa: S310 (loopback)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("Message", detail)
            raise ServiceError(f"{command}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceError(f"{command}: {exc}") from exc
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines:
            return {}
        return lines[0] if len(lines) == 1 else lines  # some commands stream ndjson

    # ------------------------------------------------------------------ steps

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["IPFS_PATH"] = str(self.repo)
        # Node 20 lacks Promise.withResolvers, which newer transitive dependencies call.
        require = f"--require {self.polyfills}"
        env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} {require}".strip()
        env.pop("DEBUG", None)  # js-ipfs debug logging floods the log
        return env

    def _overlay(self) -> Path | None:
        """Build ``<work_dir>/node_modules``: the real tree as symlinks, with the hoisted
        multiaddr replaced by libp2p's own copy (see ``_OVERLAY``); None when the installed
        tree has no such split (then the real tree is used as it is)."""
        real = self.node_modules.resolve()
        hoisted = real / "@multiformats" / "multiaddr"
        own = real / "libp2p" / "node_modules" / "@multiformats" / "multiaddr"
        hoisted_version, own_version = _package_version(hoisted), _package_version(own)
        if hoisted_version is None or own_version is None:
            return None  # libp2p uses the hoisted copy itself: nothing to reconcile
        if hoisted_version.split(".")[0] == own_version.split(".")[0]:
            return None
        overlay = self.work_dir / _OVERLAY
        if overlay.is_symlink() or overlay.is_file():
            overlay.unlink()
        elif overlay.is_dir():
            shutil.rmtree(overlay)  # symlinks only: rmtree unlinks them, never follows them
        overlay.mkdir()
        for entry in real.iterdir():  # rebuilt at every start: follows `npm install`
            if entry.name.startswith("."):  # .bin, .package-lock.json
                continue
            if entry.name.startswith("@") and entry.is_dir():
                scope = overlay / entry.name
                scope.mkdir()
                for member in entry.iterdir():
                    (scope / member.name).symlink_to(member)
            else:
                (overlay / entry.name).symlink_to(entry)
        link = overlay / "@multiformats" / "multiaddr"
        link.unlink()
        link.symlink_to(own)
        return overlay

    def _clear_stale_state(self) -> None:
        clear_stale_pidfile(self._pidfile, "a js-ipfs daemon")
        # A daemon that died keeps its lock (a directory) for 20 s and its api file for ever.
        lock = self.repo / "repo.lock"
        if lock.is_dir():
            shutil.rmtree(lock, ignore_errors=True)
        (self.repo / "api").unlink(missing_ok=True)

    def _init(self, node: str, env: dict[str, str]) -> None:
        with self.log_path.open("ab") as out:
            result = subprocess.run(
                [node, str(self.cli), "init", "--profile=test"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self.start_timeout,
                check=False,
            )
        if result.returncode != 0 or not (self.repo / "config").is_file():
            raise ServiceError(
                f"`ipfs init` failed (exit {result.returncode}); "
                f"log {self.log_path}:\n{log_tail(self.log_path)}"
            )

    def _configure(self) -> None:
        path = self.repo / "config"
        config = json.loads(path.read_text())
        self.peer_id = str(config.get("Identity", {}).get("PeerID", ""))
        addresses = config.setdefault("Addresses", {})

        def port(kind: str, host: str = "127.0.0.1") -> str:
            return f"/ip4/{host}/tcp/{self._ports.get(kind, 0)}"

        # Port 0: the OS picks a free port, the daemon writes the API address to repo/api.
        addresses.update(
            API=port("api"),
            Gateway=_LOCALHOST_ANY_PORT,
            RPC=_LOCALHOST_ANY_PORT,
            Swarm=[],
            Delegates=[],
            Announce=[],
            NoAnnounce=[],
        )
        if self.swarm:
            host = self.swarm_host
            addresses["Swarm"] = [port("tcp", host)] + (
                [port("ws", host) + "/ws"] if self.websockets else []
            )
        config["Bootstrap"] = []
        config["Routing"] = {"Type": "none"}  # no DHT: peers come only from connect()
        discovery = config.setdefault("Discovery", {})
        discovery.setdefault("MDNS", {})["Enabled"] = False
        discovery.setdefault("webRTCStar", {})["Enabled"] = False
        config.setdefault("Swarm", {})["DisableNatPortMap"] = True
        path.write_text(json.dumps(config, indent=2))

    def _ready(self) -> bool:
        api_file = self.repo / "api"
        if not api_file.is_file():
            return False
        addr = api_file.read_text().strip()
        parts = addr.split("/")  # /ip4/127.0.0.1/tcp/PORT/http
        if len(parts) < 5 or not parts[4].isdigit():
            return False
        url = f"http://{parts[2]}:{parts[4]}"
        try:
            request = urllib.request.Request(f"{url}/api/v0/id", method="POST")  # noqa: S310
            with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 (loopback)
                if response.status != 200:
                    return False
                identity = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if self.swarm and not self._read_swarm_addrs(identity):
            return False
        self.api_addr = addr if addr.endswith("/http") else f"{addr}/http"
        self.api_url = url
        return True

    def _read_swarm_addrs(self, identity: dict[str, Any]) -> bool:
        """Take the TCP (and WebSocket) listen addresses on ``swarm_host`` from an ``id``
        answer."""
        self.peer_id = str(identity.get("ID") or self.peer_id)
        tcp = ws = ""
        for addr in identity.get("Addresses") or []:
            parts = str(addr).split("/")  # ['', 'ip4', '127.0.0.1', 'tcp', PORT, ...]
            if len(parts) < 5 or parts[1:4] != ["ip4", self.swarm_host, "tcp"]:
                continue
            if parts[5:6] == ["p2p"]:
                tcp = tcp or addr
            elif parts[5:6] == ["ws"]:
                ws = ws or addr
        if not tcp or (self.websockets and not ws):
            return False
        self.swarm_addr, self.ws_addr = tcp, ws
        return True


class IpfsSwarm:
    """Named swarm daemons, each with its own repo under ``<work_dir>/<name>``, all connected
    to each other (a full mesh: fine for a handful of nodes); a context manager.

    ``start`` starts the named daemons (in parallel) and connects every pair; :meth:`add` starts
    one more later and connects it to all running ones; :meth:`restart` brings one back (same
    repo, identity and ports) and reconnects it; ``stop`` stops them all (in parallel).
    Keyword arguments go to every :class:`IpfsDaemon` (``swarm=True`` and ``keep_ports=True``
    are implied).
    """

    def __init__(
        self, work_dir: str | os.PathLike[str], names: Iterable[str] = (), **daemon_kwargs: Any
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.daemon_kwargs = {"swarm": True, "keep_ports": True, **daemon_kwargs}
        self.daemons: dict[str, IpfsDaemon] = {}
        for name in names:
            self._new(name)

    def __getitem__(self, name: str) -> IpfsDaemon:
        return self.daemons[name]

    def __iter__(self) -> Iterator[IpfsDaemon]:
        return iter(self.daemons.values())

    def __len__(self) -> int:
        return len(self.daemons)

    @property
    def names(self) -> list[str]:
        return list(self.daemons)

    def start(self) -> Self:
        """Start every daemon not running yet, then connect every running pair."""
        try:
            self._each(lambda d: d.start(), [d for d in self if not d.running()])
            self.connect_all()
        except BaseException:
            self.stop()
            raise
        return self

    def add(self, name: str, *, connect: bool = True) -> IpfsDaemon:
        """Start one more daemon called ``name`` and connect it to every running one (with
        ``connect=False`` it stays alone until :meth:`IpfsDaemon.connect` or
        :meth:`connect_all`)."""
        daemon = self._new(name)
        try:
            daemon.start()
            if connect:
                self._connect_to_others(daemon)
        except BaseException:
            daemon.stop()
            del self.daemons[name]
            raise
        return daemon

    def restart(self, name: str) -> IpfsDaemon:
        """Start a stopped daemon again (same repo, identity, API and swarm ports) and
        reconnect it to every running one."""
        daemon = self.daemons[name]
        daemon.start()
        self._connect_to_others(daemon)
        return daemon

    def connect_all(self) -> None:
        """Connect every pair of running daemons (each pair once; connections are both ways)."""
        running = [d for d in self if d.running()]
        for i, a in enumerate(running):
            for b in running[i + 1 :]:
                if b.peer_id not in a.peers():
                    a.connect(b)

    def stop(self) -> None:
        self._each(lambda d: d.stop(), list(self))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers

    def _new(self, name: str) -> IpfsDaemon:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad daemon name {name!r}")
        if name in self.daemons:
            raise ValueError(f"a daemon called {name!r} already exists")
        daemon = IpfsDaemon(self.work_dir / name, name=name, **self.daemon_kwargs)
        self.daemons[name] = daemon
        return daemon

    def _connect_to_others(self, daemon: IpfsDaemon) -> None:
        for other in self:
            if other is not daemon and other.running():
                daemon.connect(other)

    @staticmethod
    def _each(action: Callable[[IpfsDaemon], object], daemons: Sequence[IpfsDaemon]) -> None:
        """Run ``action`` on every daemon at once; the first error is raised after all end."""
        if not daemons:
            return
        with ThreadPoolExecutor(max_workers=len(daemons)) as pool:
            futures = [pool.submit(action, d) for d in daemons]
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
