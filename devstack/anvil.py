"""Start and stop a local anvil devnet (npm @foundry-rs/anvil-linux-amd64).

    with Anvil(log_file=work / "anvil.log") as anvil:
        w3 = Web3(Web3.HTTPProvider(anvil.url))

The process handling (own process group, log file, readiness probe, SIGTERM then SIGKILL) is
:class:`devstack._process.Service`, shared with the IPFS, Docker and scheduler managers.
A stopped Anvil can be started again: it keeps its port, and with ``state_file`` its chain
(anvil writes the state on SIGTERM and loads it at start).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Self

from devstack._process import ROOT, ManagedProcess, Service, ServiceError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

__all__ = ["DEV_MNEMONIC", "Anvil", "DevnetError", "anvil_binary", "dev_accounts", "free_port"]

# anvil's default dev mnemonic: its first accounts are the well-known devnet keys.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
_PORT_TRIES = 3  # a port picked by free_port() can be taken before anvil binds it


class DevnetError(ServiceError):
    """The devnet could not be started (the message names anvil's log and quotes its tail)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (another process may still take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def anvil_binary() -> str:
    """The anvil executable: the npm package's in ``node_modules/.bin``, else on ``PATH``."""
    local = ROOT / "node_modules" / ".bin" / "anvil"
    if local.exists():
        return str(local)
    found = shutil.which("anvil")
    if found is None:
        raise DevnetError("anvil not found: run `make setup` (npm ci installs it)")
    return found


@dataclass
class Anvil(Service):
    """An anvil process on 127.0.0.1; a context manager (``stop`` on exit).

    ``port`` 0 picks a free port at the first start; later starts reuse it. Without
    ``log_file`` the log goes to a temporary file, removed by :meth:`stop` (kept when a start
    fails: the error names it). ``prune_history``
    keeps no past states (True) or only the last N (an int: 128 is what a geth node that is not
    an archive keeps): calls at older blocks fail, but long runs (many thousand blocks) stay as
    fast as the first block instead of slowing down as the history grows. ``idle_block_s``
    mines an empty block whenever the chain has been idle that long (transactions are still
    mined at once): the escrow judges its windows by block time, and an idle automine chain's
    clock would otherwise stand still, as no public chain's does.
    """

    port: int = 0
    chain_id: int = 31337
    accounts: int = 12
    balance_eth: int = 10_000
    block_time: float | None = None
    state_file: Path | None = None
    log_file: Path | None = None
    prune_history: bool | int = False
    idle_block_s: float | None = None
    _proc: ManagedProcess | None = field(default=None, init=False, repr=False)
    _ticker: threading.Thread | None = field(default=None, init=False, repr=False)
    _ticking: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _temp_log: Path | None = field(default=None, init=False, repr=False)
    _log_offset: int = field(default=0, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> Self:
        """Start anvil and wait until it listens and answers ``eth_chainId``; a no-op when it runs.

        Raises :class:`DevnetError` (anvil missing, exited, or not ready within ``timeout`` s).
        When the port was picked here and anvil exits (the port was taken meanwhile), it tries
        another port, up to three times.
        """
        if self._proc is not None:
            return self
        binary = anvil_binary()
        pick = not self.port
        attempt = 0
        while True:
            attempt += 1
            if pick:
                self.port = free_port()
            log_path = self._log_path()
            self._log_offset = log_path.stat().st_size if log_path.exists() else 0
            self._proc = ManagedProcess("anvil", self._argv(binary), log_path)
            try:
                self._proc.start()
                self._proc.wait_ready(self._ready, timeout)
                self._start_ticker()
                return self
            except ServiceError as exc:
                proc, self._proc = self._proc, None
                proc.stop()
                self._temp_log = None  # keep the failed run's log: the message names it
                if pick and attempt < _PORT_TRIES and "Address already in use" in str(exc):
                    continue  # the port was taken after free_port() saw it free: another one
                failed_port = self.port
                if pick:
                    self.port = 0
                raise DevnetError(f"anvil on port {failed_port}: {exc}") from exc

    def stop(self) -> None:
        """SIGTERM anvil (it writes ``state_file``), SIGKILL after 15 s; a no-op when stopped."""
        self._ticking.set()
        if self._ticker is not None:
            self._ticker.join(5)
            self._ticker = None
        super().stop()
        if self._temp_log is not None:
            self._temp_log.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._temp_log.parent.rmdir()
            self._temp_log = None

    # ------------------------------------------------------------------ steps

    def _start_ticker(self) -> None:
        if not self.idle_block_s or self._ticker is not None:
            return
        self._ticking.clear()
        self._ticker = threading.Thread(target=self._tick, name="anvil-idle-blocks", daemon=True)
        self._ticker.start()

    def _rpc(self, method: str, params: list[object]) -> object:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            conn.request("POST", "/", body, {"Content-Type": "application/json"})
            return json.loads(conn.getresponse().read()).get("result")
        finally:
            conn.close()

    def _tick(self) -> None:
        """Mine an empty block when the latest is ``idle_block_s`` old (by the wall clock; a
        test that moved the chain's clock ahead just sees blocks a second apart)."""
        assert self.idle_block_s is not None
        while not self._ticking.wait(self.idle_block_s / 2):
            try:
                block = self._rpc("eth_getBlockByNumber", ["latest", False])
                stamp = int(block["timestamp"], 16) if isinstance(block, dict) else 0
                if time.time() - stamp >= self.idle_block_s:
                    self._rpc("evm_mine", [])
            except (OSError, http.client.HTTPException, ValueError):
                continue  # anvil restarting or stopping: try again next tick

    def _argv(self, binary: str) -> list[str]:
        cmd = [
            binary,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--chain-id", str(self.chain_id),
            "--accounts", str(self.accounts),
            "--balance", str(self.balance_eth),
            "--mnemonic", DEV_MNEMONIC,
            "--hardfork", "prague",
        ]  # fmt: skip
        if self.block_time:
            cmd += ["--block-time", str(self.block_time)]
        if self.state_file is not None:
            cmd += ["--state", str(self.state_file)]
        if self.prune_history is True:
            cmd += ["--prune-history"]
        elif self.prune_history:
            cmd += ["--prune-history", str(self.prune_history)]
        return cmd

    def _log_path(self) -> Path:
        if self.log_file is not None:
            return Path(self.log_file)
        if self._temp_log is None:
            self._temp_log = Path(tempfile.mkdtemp(prefix="gridmarket-anvil-")) / "anvil.log"
        return self._temp_log

    def _ready(self) -> bool:
        """The readiness probe: this process logged that it listens, and the port answers.

        The log line matters: on a port another node holds, that node would answer the
        request while this anvil is still on its way out with "address in use".
        """
        try:
            with Path(self._log_path()).open("rb") as f:
                f.seek(self._log_offset)
                if f"Listening on 127.0.0.1:{self.port}".encode() not in f.read():
                    return False
        except OSError:
            return False
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
            conn.request("POST", "/", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status == 200 and "result" in json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError):
            return False
        finally:
            conn.close()


def dev_accounts(count: int = 10) -> list[str]:
    """Private keys of anvil's dev accounts (hex), derived from the dev mnemonic."""
    from eth_account import Account

    Account.enable_unaudited_hdwallet_features()
    return [
        "0x"
        + bytes(Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key).hex()
        for i in range(count)
    ]


class DevRoles:
    """The project's roles over anvil's dev accounts (``accounts``, in mnemonic order): 0 owner
    and deployer, 1 operator (the scheduler's key), 2 treasury, 3-4 submitters, 5-9 providers,
    10 mediator (needs ``dev_accounts(11)`` or more)."""

    accounts: list[LocalAccount]

    @property
    def owner(self) -> LocalAccount:
        return self.accounts[0]

    @property
    def operator(self) -> LocalAccount:
        return self.accounts[1]

    @property
    def treasury(self) -> LocalAccount:
        return self.accounts[2]

    @property
    def submitters(self) -> list[LocalAccount]:
        return self.accounts[3:5]

    @property
    def submitter(self) -> LocalAccount:
        return self.accounts[3]

    @property
    def providers(self) -> list[LocalAccount]:
        return self.accounts[5:10]

    @property
    def mediator(self) -> LocalAccount:
        if len(self.accounts) < 11:
            raise DevnetError("the mediator is dev account 10: derive at least 11 accounts")
        return self.accounts[10]
