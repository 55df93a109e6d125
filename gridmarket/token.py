"""ERC-20 bounties: the tokens a deployment lists, amounts in their units, EIP-2612 permits.

A job is paid in ETH (the zero address) or in an ERC-20 token the escrow's owner allow-listed
(``setToken``). The deployment file names the listed tokens (``tokens``: symbol -> address and
decimals), so the services, the CLI and the pages show amounts in the job's own units. Funding a
token job is one transaction: ``multicall([permitToken(...), createJobWith(...)])``, where the
permit is the submitter's EIP-2612 signature over the token's own domain separator, read from the
token (``DOMAIN_SEPARATOR()``), so any EIP-2612 token works whatever its domain's name or version.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from gridmarket.amounts import parse_units
from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.ethsig import keccak, to_checksum_address

if TYPE_CHECKING:  # web3 is only needed by whoever builds a TokenClient (it passes a Web3)
    from eth_account.signers.local import LocalAccount
    from web3 import Web3

ETH = "ETH"
"""The symbol of the chain's own coin: a job funded with ``createJob`` (token address zero)."""

PERMIT_TYPEHASH = keccak(
    b"Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)"
)

ERC20_ABI: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": name,
        "stateMutability": mut,
        "inputs": [{"name": f"a{i}", "type": t} for i, t in enumerate(ins)],
        "outputs": [{"name": "", "type": t} for t in outs],
    }
    for name, mut, ins, outs in (
        ("balanceOf", "view", ["address"], ["uint256"]),
        ("allowance", "view", ["address", "address"], ["uint256"]),
        ("nonces", "view", ["address"], ["uint256"]),
        ("DOMAIN_SEPARATOR", "view", [], ["bytes32"]),
        ("decimals", "view", [], ["uint8"]),
        ("symbol", "view", [], ["string"]),
        ("approve", "nonpayable", ["address", "uint256"], ["bool"]),
        ("transfer", "nonpayable", ["address", "uint256"], ["bool"]),
        ("mint", "nonpayable", ["address", "uint256"], []),
    )
]


@dataclass(frozen=True, slots=True)
class Token:
    """A currency a job can be paid in: ETH (address zero, 18 decimals) or a listed ERC-20."""

    symbol: str
    address: str
    decimals: int

    @property
    def is_eth(self) -> bool:
        return self.address == ZERO_ADDRESS

    def to_units(self, amount: str | Decimal | int) -> int:
        """``"1.5"`` in this token -> its smallest units; refuses more decimals than it has,
        and anything unbounded (:func:`gridmarket.amounts.parse_units`: ``AmountError``, a
        ValueError)."""
        smallest = "wei" if self.is_eth else f"units of {self.symbol}"
        return parse_units(amount, self.decimals, unit=self.symbol, smallest=smallest)

    def fmt(self, units: int) -> str:
        """Units as a readable amount with the symbol: ``1.5 tUSD``, ``0.01 ETH``."""
        text = format(Decimal(units) / (Decimal(10) ** self.decimals), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return f"{text} {self.symbol}"


ETH_TOKEN = Token(ETH, ZERO_ADDRESS, 18)


def tokens_of(listed: dict[str, Any]) -> dict[str, Token]:
    """The deployment file's ``tokens`` section as :class:`Token` by symbol, ETH included."""
    out = {ETH: ETH_TOKEN}
    for symbol, entry in (listed or {}).items():
        out[str(symbol)] = Token(
            str(symbol), to_checksum_address(entry["address"]), int(entry["decimals"])
        )
    return out


def by_address(tokens: dict[str, Token], address: str) -> Token:
    """The listed token at ``address``; an unknown one shows by its address, 18 decimals."""
    address = to_checksum_address(address)
    for token in tokens.values():
        if token.address == address:
            return token
    return Token(address, address, 18)


class TokenClient:
    """Calls and transactions of one ERC-20 (reads, approve, mint on the devnet, permits)."""

    def __init__(self, w3: Web3, address: str) -> None:
        self.w3 = w3
        self.address = to_checksum_address(address)
        self.contract = w3.eth.contract(address=cast(Any, self.address), abi=ERC20_ABI)

    def balance_of(self, account: str) -> int:
        return int(self.contract.functions.balanceOf(to_checksum_address(account)).call())

    def allowance(self, owner: str, spender: str) -> int:
        fn = self.contract.functions.allowance
        return int(fn(to_checksum_address(owner), to_checksum_address(spender)).call())

    def send(self, account: LocalAccount, fn_name: str, *args: Any) -> str:
        """Sign and send ``fn_name(*args)`` from ``account``; wait; return the tx hash."""
        fn = getattr(self.contract.functions, fn_name)(*args)
        tx = fn.build_transaction(
            {
                "from": account.address,
                "nonce": self.w3.eth.get_transaction_count(account.address, "pending"),
                "chainId": self.w3.eth.chain_id,
            }
        )
        signed = account.sign_transaction(cast(Any, tx))
        receipt = self.w3.eth.wait_for_transaction_receipt(
            self.w3.eth.send_raw_transaction(signed.raw_transaction)
        )
        if receipt["status"] != 1:
            raise RuntimeError(f"{fn_name} on token {self.address} reverted")
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def sign_permit(
        self, owner: LocalAccount, spender: str, value: int, deadline: int
    ) -> tuple[int, bytes, bytes]:
        """The owner's EIP-2612 permit for ``spender`` as ``(v, r, s)``, over the token's own
        ``DOMAIN_SEPARATOR()`` and the owner's current nonce."""
        from eth_abi.abi import encode
        from eth_typing import Hash32

        domain = bytes(self.contract.functions.DOMAIN_SEPARATOR().call())
        nonce = int(self.contract.functions.nonces(owner.address).call())
        struct = keccak(
            encode(
                ["bytes32", "address", "address", "uint256", "uint256", "uint256"],
                [
                    PERMIT_TYPEHASH,
                    owner.address,
                    to_checksum_address(spender),
                    value,
                    nonce,
                    deadline,
                ],
            )
        )
        digest = keccak(b"\x19\x01" + domain + struct)
        sig = owner.unsafe_sign_hash(Hash32(digest))
        return int(sig.v), int(sig.r).to_bytes(32, "big"), int(sig.s).to_bytes(32, "big")
