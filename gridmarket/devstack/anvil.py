"""Start and stop a local anvil devnet (npm @foundry-rs/anvil-linux-amd64)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from gridmarket.build import ROOT

# anvil's default dev mnemonic: its first accounts are the well-known devnet keys.
DEV_MNEMONIC = "test test test test test test test test test test test junk"


class DevnetError(RuntimeError):
    """The devnet could not be started."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def anvil_binary() -> str:
    local = ROOT / "node_modules" / ".bin" / "anvil"
    if local.exists():
        return str(local)
    found = shutil.which("anvil")
    if found is None:
        raise DevnetError("anvil not found: run `make setup` (npm ci installs it)")
    return found


@dataclass
class Anvil:
    """An anvil process on 127.0.0.1; a context manager."""

    port: int = 0
    chain_id: int = 31337
    accounts: int = 10
    balance_eth: int = 10_000
    block_time: float | None = None
    state_file: Path | None = None
    log_file: Path | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> Anvil:
        if not self.port:
            self.port = free_port()
        cmd = [
            anvil_binary(),
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
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise DevnetError(
                    f"anvil exited with {self._proc.returncode}; see {self.log_file or 'stdout'}"
                )
            try:
                r = httpx.post(
                    self.url,
                    json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                    timeout=1,
                )
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise DevnetError(f"anvil did not answer on {self.url} within {timeout}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> Anvil:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def dev_accounts(count: int = 10) -> list[str]:
    """Private keys of anvil's dev accounts (hex), derived from the dev mnemonic."""
    from eth_account import Account

    Account.enable_unaudited_hdwallet_features()
    return [
        "0x"
        + bytes(Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key).hex()
        for i in range(count)
    ]
