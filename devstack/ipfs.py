"""Start and stop a local, offline js-ipfs daemon (npm ``ipfs@0.66.1``) speaking the Kubo RPC API.

    with IpfsDaemon(work_dir).start() as ipfs:
        storage = AgentIpfsStore(ipfs.api_addr)

The repository lives in ``<work_dir>/repo`` (initialised once, reused by later starts), the log in
``<work_dir>/ipfs.log``. The daemon listens on 127.0.0.1 only, on ports the OS picks, with no
swarm, no bootstrap peers, no routing and no preload nodes: nothing leaves the machine.
Pitfalls behind each step are in docs/platform.md ("IPFS and Docker").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from devstack._process import (
    ROOT,
    ManagedProcess,
    Service,
    ServiceError,
    clear_stale_pidfile,
    log_tail,
)

__all__ = ["IpfsDaemon", "ServiceError"]

_LOCALHOST_ANY_PORT = "/ip4/127.0.0.1/tcp/0"


class IpfsDaemon(Service):
    """A js-ipfs daemon owned by this process; a context manager (``stop`` on exit)."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        node_modules: Path = ROOT / "node_modules",
        polyfills: Path = ROOT / "tools" / "node-polyfills.cjs",
        node: str = "node",
        start_timeout: float = 60.0,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.repo = self.work_dir / "repo"
        self.log_path = self.work_dir / "ipfs.log"
        self.cli = node_modules / "ipfs" / "src" / "cli.js"
        self.polyfills = polyfills
        self.node = node
        self.start_timeout = start_timeout
        self._pidfile = self.work_dir / "ipfs.pid"
        self.api_addr = ""
        """Multiaddr of the RPC API, e.g. ``/ip4/127.0.0.1/tcp/41234/http`` (ipfshttpclient)."""
        self.api_url = ""
        """Base URL of the RPC API, e.g. ``http://127.0.0.1:41234``."""

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
        self._configure()
        proc = ManagedProcess(
            "js-ipfs daemon",
            [node, str(self.cli), "daemon", "--offline", "--enable-preload=false"],
            self.log_path,
            env=env,
            cwd=self.work_dir,
        )
        self._launch(
            proc, self._ready, self.start_timeout, lambda pid: self._pidfile.write_text(str(pid))
        )
        return self

    def stop(self) -> None:
        super().stop()
        self._pidfile.unlink(missing_ok=True)
        (self.repo / "api").unlink(missing_ok=True)

    # ------------------------------------------------------------------ steps

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["IPFS_PATH"] = str(self.repo)
        # Node 20 lacks Promise.withResolvers, which newer transitive dependencies call.
        require = f"--require {self.polyfills}"
        env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} {require}".strip()
        env.pop("DEBUG", None)  # js-ipfs debug logging floods the log
        return env

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
        addresses = config.setdefault("Addresses", {})
        # Port 0: the OS picks a free port, the daemon writes the API address to repo/api.
        addresses.update(
            API=_LOCALHOST_ANY_PORT,
            Gateway=_LOCALHOST_ANY_PORT,
            RPC=_LOCALHOST_ANY_PORT,
            Swarm=[],  # a loopback swarm address makes the daemon hang before opening the API
            Delegates=[],
            Announce=[],
            NoAnnounce=[],
        )
        config["Bootstrap"] = []
        config["Routing"] = {"Type": "none"}
        discovery = config.setdefault("Discovery", {})
        discovery.setdefault("MDNS", {})["Enabled"] = False
        discovery.setdefault("webRTCStar", {})["Enabled"] = False
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
        except (urllib.error.URLError, OSError):
            return False
        self.api_addr = addr if addr.endswith("/http") else f"{addr}/http"
        self.api_url = url
        return True
