"""gridmarket.ethsig against the libraries it replaces on the agent's path: the same hashes,
checksums, errors and signatures as eth-utils and eth-account, over many random keys and
messages (seeded: a failure replays)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from eth_utils import keccak as ref_keccak
from eth_utils.address import is_hex_address as ref_is_hex_address
from eth_utils.address import to_checksum_address as ref_checksum

from gridmarket import ethsig
from gridmarket.eip712 import (
    acceptance_digest,
    acceptance_typed_data,
    recover_acceptance_signer,
    recover_result_signer,
    result_typed_data,
    sign_acceptance,
    sign_result,
)
from gridmarket.escrow import Job
from gridmarket.keystore import KeystoreError, create_keystore, load_account, load_signer
from gridmarket.wire import (
    NodeCapacityIn,
    NodeRegistration,
    recover_registration_signer,
    registration_typed_data,
    sign_registration,
)

ROUNDS = 150


def rand_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


def rand_address(rng: random.Random) -> str:
    return "0x" + rand_bytes(rng, 20).hex()


def rand_key(rng: random.Random) -> bytes:
    return rand_bytes(rng, 32)  # below the curve order but for a 2**-128 chance


def eth_account_digest(message: dict[str, Any]) -> bytes:
    return bytes(_hash_eip191_message(encode_typed_data(full_message=message)))


def outcome(fn: Any, *args: Any) -> tuple[str, str]:
    try:
        return ("ok", repr(fn(*args)))
    except Exception as exc:
        return (type(exc).__name__, str(exc))


# --------------------------------------------------------------------------- hashing, addresses


def test_keccak_matches_eth_utils() -> None:
    rng = random.Random(1)
    for n in [0, 1, 31, 32, 33, 135, 136, 137, 1000]:
        data = rand_bytes(rng, n)
        assert ethsig.keccak(data) == ref_keccak(data)


def test_checksums_match_eth_utils() -> None:
    rng = random.Random(2)
    for _ in range(ROUNDS):
        raw = rand_bytes(rng, 20)
        lower = "0x" + raw.hex()
        for form in (lower, lower.upper().replace("0X", "0x"), lower[2:], "0X" + lower[2:], raw):
            assert ethsig.to_checksum_address(form) == ref_checksum(form)
        checksummed = ref_checksum(lower)
        assert ethsig.to_checksum_address(checksummed) == checksummed


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0x",
        "0x12",
        "not an address",
        "0xzz" + "0" * 38,
        "0x" + "0" * 41,
        "0" * 39,
        b"\x00" * 19,
        b"\x00" * 21,
        "0x" + "a" * 40 + " ",
        "\u0661" * 40,  # Arabic-Indic digits: not hex for either
    ],
)
def test_not_an_address_fails_as_in_eth_utils(value: str | bytes) -> None:
    mine = outcome(ethsig.to_checksum_address, value)
    assert mine[0] != "ok"
    assert mine == outcome(ref_checksum, value)
    assert ethsig.is_hex_address(value) == ref_is_hex_address(value)


def test_is_hex_address_matches_eth_utils() -> None:
    rng = random.Random(3)
    samples: list[object] = [None, 5, b"\x00" * 20, "0x" + "g" * 40, "0X" + "A" * 40]
    samples += [rand_address(rng)[: rng.randrange(0, 43)] for _ in range(50)]
    for value in samples:
        assert ethsig.is_hex_address(value) == ref_is_hex_address(value), value


# --------------------------------------------------------------------------- EIP-712


def random_job(rng: random.Random) -> Job:
    return Job(
        submitter=ref_checksum(rand_address(rng)),
        bounty=rng.randrange(2**96),
        deadline=rng.randrange(2**40),
        fee_bps=rng.randrange(10_001),
        collateral=rng.randrange(2**96),
        mediator=ref_checksum(rand_address(rng)),
        flags=rng.randrange(256),
        token=rng.choice(["0x" + "0" * 40, ref_checksum(rand_address(rng))]),
    )


def random_text(rng: random.Random) -> str:
    alphabet = "abcxyz019 -_/é€𝄞"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))


def project_messages(rng: random.Random) -> list[dict[str, Any]]:
    """The three messages the agent signs, with random contents."""
    chain_id = rng.choice([1, 31337, rng.randrange(1, 2**64)])
    escrow = rng.choice([rand_address(rng), ref_checksum(rand_address(rng))])
    registration = NodeRegistration(
        wallet=ref_checksum(rand_address(rng)),
        name="node-" + str(rng.randrange(10**6)),
        capacity=NodeCapacityIn(
            cpu_cores=rng.randrange(1, 128),
            ram_mib=rng.randrange(1, 2**20),
            disk_mib=rng.randrange(0, 2**30),
            region="eu-west",
            executors=["wasm"],
        ),
        agent_version=random_text(rng)[:64],
        nonce=rng.randrange(2**63),
        expiry=rng.randrange(2**63),
    )
    return [
        result_typed_data(
            chain_id, escrow, rand_bytes(rng, 32), rng.randrange(2**16), random_text(rng)
        ),
        acceptance_typed_data(
            chain_id,
            escrow,
            rand_bytes(rng, 32),
            rng.randrange(2**16),
            random_job(rng),
            rng.randrange(2**32),
        ),
        registration_typed_data(chain_id, ref_checksum(escrow), registration),
    ]


def random_struct_message(rng: random.Random) -> dict[str, Any]:
    """A message of random atomic, dynamic and nested struct fields (no arrays)."""

    def value(type_: str) -> Any:
        if type_ == "address":
            return rng.choice([rand_address(rng), ref_checksum(rand_address(rng))])
        if type_ == "bool":
            return rng.choice([True, False])
        if type_ == "string":
            return random_text(rng)
        if type_ == "bytes":
            return rand_bytes(rng, rng.randrange(0, 80))
        if type_.startswith("bytes"):
            size = int(type_[5:])
            return rand_bytes(rng, rng.randrange(1, size + 1))  # shorter values are padded
        bits = int(type_.removeprefix("u")[3:])
        if type_.startswith("uint"):
            return rng.randrange(2**bits)
        return rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1))

    atomic = ["address", "bool", "string", "bytes", "bytes1", "bytes7", "bytes32"]
    atomic += [f"uint{8 * rng.randrange(1, 33)}", f"int{8 * rng.randrange(1, 33)}"]
    inner = [{"name": f"i{k}", "type": rng.choice(atomic)} for k in range(rng.randrange(1, 4))]
    outer = [{"name": f"f{k}", "type": rng.choice(atomic)} for k in range(rng.randrange(0, 6))]
    outer.insert(rng.randrange(len(outer) + 1), {"name": "nested", "type": "Inner"})
    message = {f["name"]: value(f["type"]) for f in outer if f["type"] != "Inner"}
    message["nested"] = {f["name"]: value(f["type"]) for f in inner}
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "Outer": outer,
            "Inner": inner,
        },
        "primaryType": "Outer",
        "domain": {
            "name": random_text(rng),
            "version": str(rng.randrange(10)),
            "chainId": rng.randrange(1, 2**64),
            "verifyingContract": rand_address(rng),
        },
        "message": message,
    }


def test_typed_data_hashes_match_eth_account() -> None:
    rng = random.Random(4)
    for _ in range(ROUNDS):
        for message in [*project_messages(rng), random_struct_message(rng)]:
            assert ethsig.hash_typed_data(message) == eth_account_digest(message)


def test_signatures_are_byte_identical_to_eth_account() -> None:
    rng = random.Random(5)
    for _ in range(ROUNDS):
        key = rand_key(rng)
        reference = Account.from_key(key)
        mine = ethsig.KeyAccount(key)
        assert mine.address == reference.address
        assert mine.key == bytes(reference.key)
        for message in [*project_messages(rng), random_struct_message(rng)]:
            expected = bytes(
                reference.sign_message(encode_typed_data(full_message=message)).signature
            )
            assert ethsig.sign_typed_data(mine, message) == expected
            assert ethsig.sign_typed_data(reference, message) == expected  # a LocalAccount too


def test_the_acceptance_digest_is_the_typed_data_hash() -> None:
    """The acceptance digest built from precomputed type and domain hashes (what the agent signs
    and the scheduler recovers, once per claim) equals eth-account's EIP-712 hash of the full
    message, over random and edge-case terms, escrows and chains; a value its type cannot hold
    is refused as the full encoder refuses it."""
    rng = random.Random(12)
    edge = Job(
        submitter="0x" + "0" * 40,
        bounty=2**96 - 1,
        deadline=2**40 - 1,
        fee_bps=0,
        collateral=0,
        mediator="0x" + "f" * 40,
        flags=255,
        token="0x" + "F" * 40,
    )
    cases = [
        (1, "0x" + "1" * 40, bytes(32), 1, edge, 0),
        (2**64, "0x" + "a" * 40, b"\xff" * 32, 2**16 - 1, edge, 2**32 - 1),
    ]
    for _ in range(ROUNDS):
        chain_id = rng.choice([1, 31337, rng.randrange(1, 2**256)])
        escrow = rng.choice([ref_checksum(rand_address(rng)), rand_address(rng).lower()])
        cases.append(
            (
                chain_id,
                escrow,
                rand_bytes(rng, 32),
                rng.randrange(1, 2**16),
                random_job(rng),
                rng.randrange(2**32),
            )
        )
    for chain_id, escrow, job_id, attempt, job, hold_for in cases:
        message = acceptance_typed_data(chain_id, escrow, job_id, attempt, job, hold_for)
        assert message["domain"]["version"] == "5"
        assert message["message"]["holdFor"] == hold_for
        expected = eth_account_digest(message)
        assert acceptance_digest(chain_id, escrow, job_id, attempt, job, hold_for) == expected
        assert ethsig.hash_typed_data(message) == expected
    job = random_job(rng)
    for bad in (
        {"bounty": 2**96},
        {"deadline": -1},
        {"collateral": 2**96},
        {"flags": 256},
        {"mediator": "0x1234"},
        {"token": "not an address"},
    ):
        with pytest.raises(ValueError):
            acceptance_digest(1, "0x" + "1" * 40, bytes(32), 1, replace(job, **bad), 60)
    with pytest.raises(ValueError):
        acceptance_digest(1, "0x" + "1" * 40, bytes(31), 1, job, 60)
    with pytest.raises(ValueError):
        acceptance_digest(1, "0x" + "1" * 40, bytes(32), 2**16, job, 60)
    for hold_for in (-1, 2**32):  # a uint32
        with pytest.raises(ValueError):
            acceptance_digest(1, "0x" + "1" * 40, bytes(32), 1, job, hold_for)


def test_the_project_signatures_recover_to_the_signer() -> None:
    rng = random.Random(6)
    for _ in range(20):
        account = ethsig.KeyAccount(rand_key(rng))
        escrow = ref_checksum(rand_address(rng))
        job_id, attempt, job = rand_bytes(rng, 32), rng.randrange(1, 2**16), random_job(rng)
        hold_for = rng.randrange(2**32)
        signature = sign_acceptance(account, 31337, escrow, job_id, attempt, job, hold_for)
        assert recover_acceptance_signer(
            signature, 31337, escrow, job_id, attempt, job, hold_for
        ) == (account.address)
        signature = sign_result(account, 31337, escrow, job_id, attempt, "bafyresult")
        assert recover_result_signer(signature, 31337, escrow, job_id, attempt, "bafyresult") == (
            account.address
        )
        registration = NodeRegistration(
            wallet=account.address,
            name="n1",
            capacity=NodeCapacityIn(
                cpu_cores=2, ram_mib=2048, disk_mib=10, region="eu-west", executors=["wasm"]
            ),
            nonce=1,
            expiry=2,
        )
        signed = sign_registration(account, 31337, escrow, registration)
        assert recover_registration_signer(31337, escrow, registration, signed) == account.address


def test_an_acceptance_signed_for_one_hold_does_not_recover_for_another() -> None:
    """``holdFor`` is signed (EIP-712 ``Acceptance``, version 5): an acceptance of the same
    terms for another hold recovers another address, so the operator cannot give the provider
    less (or more) time than it signed for; and a version-4 digest (no ``holdFor``) is not the
    version-5 one."""
    rng = random.Random(13)
    for _ in range(20):
        account = ethsig.KeyAccount(rand_key(rng))
        escrow = ref_checksum(rand_address(rng))
        job_id, attempt, job = rand_bytes(rng, 32), rng.randrange(1, 2**16), random_job(rng)
        hold_for = rng.randrange(1, 2**32 - 1)
        signature = sign_acceptance(account, 31337, escrow, job_id, attempt, job, hold_for)
        assert (
            recover_acceptance_signer(signature, 31337, escrow, job_id, attempt, job, hold_for)
            == account.address
        )
        for other in (hold_for - 1, hold_for + 1, 0, 2**32 - 1):
            if other == hold_for:
                continue
            assert (
                recover_acceptance_signer(signature, 31337, escrow, job_id, attempt, job, other)
                != account.address
            )
        message = acceptance_typed_data(31337, escrow, job_id, attempt, job, hold_for)
        v4 = {
            **message,
            "types": {
                **message["types"],
                "Acceptance": [f for f in message["types"]["Acceptance"] if f["name"] != "holdFor"],
            },
            "domain": {**message["domain"], "version": "4"},
            "message": {k: v for k, v in message["message"].items() if k != "holdFor"},
        }
        assert eth_account_digest(v4) != acceptance_digest(
            31337, escrow, job_id, attempt, job, hold_for
        )


def test_recovery_matches_eth_account_on_what_the_escrow_takes() -> None:
    rng = random.Random(7)
    for _ in range(ROUNDS):
        account = ethsig.KeyAccount(rand_key(rng))
        digest = rand_bytes(rng, 32)
        signature = ethsig.sign_digest(account.key, digest)
        assert ethsig.recover_digest(digest, signature) == account.address
        assert Account._recover_hash(digest, signature=signature) == account.address
        other = rand_bytes(rng, 32)  # another digest recovers another address, as in eth-account
        assert ethsig.recover_digest(other, signature) == Account._recover_hash(
            other, signature=signature
        )


def test_recovery_refuses_what_the_escrow_refuses() -> None:
    """``JobEscrow._recover`` takes 65 bytes, ``v`` 27 or 28 and a low ``s`` only; eth-account
    also takes ``v`` 0 or 1 and a high ``s`` (the same signer): the scheduler must not accept
    an acceptance that ``assign`` would refuse."""
    account = ethsig.KeyAccount(bytes(range(1, 33)))
    digest = bytes(32)
    sig = ethsig.sign_digest(account.key, digest)
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    high_s = r + (ethsig.SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])
    assert Account._recover_hash(digest, signature=high_s) == account.address  # eth-account: ok
    cases = {
        f"v must be 27 or 28, not {v - 27}": sig[:64] + bytes([v - 27]),
        "v must be 27 or 28, not 29": sig[:64] + b"\x1d",
        "a low-s signature": high_s,
        "a signature is 65 bytes (r || s || v), not 64": sig[:64],
        "a signature is 65 bytes (r || s || v), not 66": sig + b"\x00",
        "r must be in [1, n)": bytes(32) + sig[32:],
    }
    for why, bad in cases.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            ethsig.recover_digest(digest, bad)
    with pytest.raises(ValueError, match="digest must be 32 bytes"):
        ethsig.recover_digest(digest[:31], sig)
    job = Job(
        submitter="0x" + "1" * 40,
        bounty=1,
        fee_bps=0,
        deadline=2,
        collateral=1,
        mediator="0x" + "2" * 40,
        flags=0,
        token="0x" + "0" * 40,
    )
    good = sign_acceptance(account, 1, "0x" + "3" * 40, digest, 1, job, 600)
    flipped = (
        good[:32]
        + (ethsig.SECP256K1_N - int.from_bytes(good[32:64], "big")).to_bytes(32, "big")
        + bytes([55 - good[64]])
    )
    with pytest.raises(ValueError, match="low-s"):
        recover_acceptance_signer(flipped, 1, "0x" + "3" * 40, digest, 1, job, 600)


def test_typed_data_errors() -> None:
    message = result_typed_data(1, "0x" + "1" * 40, b"\x00" * 32, 1, "x")
    with pytest.raises(ValueError, match="out of range"):
        ethsig.hash_typed_data({**message, "message": {**message["message"], "attempt": 2**16}})
    with pytest.raises(ValueError, match="Invalid domain key"):
        ethsig.hash_typed_data({**message, "domain": {**message["domain"], "other": 1}})
    with pytest.raises(ValueError, match="primaryType"):
        ethsig.hash_typed_data({**message, "primaryType": "Acceptance"})
    array = {**message, "types": {"Result": [{"name": "xs", "type": "uint8[]"}]}}
    with pytest.raises(ValueError, match="array types are not supported"):
        ethsig.hash_typed_data({**array, "message": {"xs": [1]}})


def test_key_account_refuses_bad_keys() -> None:
    for bad in (b"", b"\x00" * 31, b"\x00" * 32, b"\xff" * 32):
        with pytest.raises(ValueError):
            ethsig.KeyAccount(bad)
    assert "KeyAccount(0x" in repr(ethsig.KeyAccount(b"\x01" * 32))
    assert (b"\x01" * 32).hex() not in repr(ethsig.KeyAccount(b"\x01" * 32))


def test_as_local_account() -> None:
    account = ethsig.KeyAccount(b"\x02" * 32)
    local = ethsig.as_local_account(account)
    assert local.address == account.address and bytes(local.key) == account.key
    assert ethsig.as_local_account(local) is local


# --------------------------------------------------------------------------- transactions


def random_transaction(rng: random.Random, kind: int) -> dict[str, Any]:
    """A transaction eth-account signs: every field at its edges (0, one byte, 55/56-byte RLP
    boundaries, 2**256-1 amounts), a contract creation now and then."""
    tx: dict[str, Any] = {
        "chainId": rng.choice([1, 31337, 11155111, 2**40]),
        "nonce": rng.choice([0, 1, 127, 128, 2**32]),
        "gas": rng.choice([21_000, 500_000, 30_000_000]),
        "value": rng.choice([0, 1, 10**18, 2**256 - 1]),
        "data": rand_bytes(rng, rng.choice([0, 1, 4, 54, 55, 56, 300, 5000])),
    }
    if rng.random() < 0.9:
        tx["to"] = ref_checksum(rand_address(rng))
    if kind == 2:
        tx["type"] = 2
        tx["maxPriorityFeePerGas"] = rng.choice([0, 1, 10**9])
        tx["maxFeePerGas"] = tx["maxPriorityFeePerGas"] + rng.choice([0, 7, 10**11])
        if rng.random() < 0.3:
            tx["accessList"] = [
                {
                    "address": ref_checksum(rand_address(rng)),
                    "storageKeys": ["0x" + rand_bytes(rng, 32).hex() for _ in range(k)],
                }
                for k in range(rng.randint(1, 3))
            ]
    else:
        tx["gasPrice"] = rng.choice([0, 1, 10**9, 2**64])
    return tx


@pytest.mark.parametrize("kind", [2, 0])
def test_transactions_are_byte_identical_to_eth_account(kind: int) -> None:
    """EIP-1559 (type 2) and legacy EIP-155 transactions: the raw bytes and the hash
    ``LocalAccount.sign_transaction`` gives, for KeyAccount and LocalAccount signers; data as
    bytes or hex."""
    rng = random.Random(7 + kind)
    for i in range(ROUNDS):
        key = rand_key(rng)
        reference = Account.from_key(key)
        tx = random_transaction(rng, kind)
        expected = reference.sign_transaction(dict(tx))
        signer = ethsig.KeyAccount(key) if i % 2 else reference
        if i % 3 == 0:
            tx["data"] = "0x" + tx["data"].hex()
        mine = ethsig.sign_transaction(signer, tx)
        assert mine.raw_transaction == bytes(expected.raw_transaction), tx
        assert mine.hash == bytes(expected.hash)


def test_rlp_matches_the_rlp_package() -> None:
    import rlp

    rng = random.Random(9)

    def item(depth: int) -> Any:
        if depth > 3 or rng.random() < 0.5:
            return rand_bytes(rng, rng.choice([0, 1, 2, 55, 56, 300, 70_000]))
        return [item(depth + 1) for _ in range(rng.randint(0, 4))]

    for _ in range(ROUNDS):
        value = item(0)
        assert ethsig.rlp_encode(value) == rlp.encode(value)
    assert ethsig.rlp_encode(b"\x7f") == b"\x7f" and ethsig.rlp_encode(b"\x80") == b"\x81\x80"


def test_transaction_mistakes_are_refused() -> None:
    signer = ethsig.KeyAccount(b"\x01" * 32)
    base = {"chainId": 1, "nonce": 0, "gas": 21_000, "to": "0x" + "11" * 20}
    for tx, message in [
        ({**base, "gasPrice": 1, "maxFeePerGas": 1}, "unknown transaction fields"),
        ({**base, "maxFeePerGas": 2, "maxPriorityFeePerGas": 1, "from": "x"}, "unknown"),
        ({**base, "gasPrice": -1}, "'gasPrice' must be an int"),
        ({**base, "gasPrice": 1, "value": 2**256}, "'value' must be an int"),
        ({**base, "gasPrice": 1, "nonce": True}, "'nonce' must be an int"),
        ({**base, "maxPriorityFeePerGas": 1}, r"for type 0: \['maxPriorityFeePerGas'\]"),
        ({**base, "gasPrice": 1, "to": "0x12"}, "not an address"),
        ({**base, "gasPrice": 1, "data": "0xzz"}, "is not hex"),
        ({**base, "maxFeePerGas": 1, "maxPriorityFeePerGas": 1, "type": 1}, "does not match"),
    ]:
        with pytest.raises(ValueError, match=message):
            ethsig.sign_transaction(signer, tx)


# --------------------------------------------------------------------------- keystores


@pytest.mark.parametrize(("kdf", "iterations"), [("scrypt", 2**4), ("pbkdf2", 100)])
def test_keystore_decryption_matches_eth_account(kdf: str, iterations: int) -> None:
    rng = random.Random(7)
    for password in ["pw", "pässwörd €", ""]:
        key = rand_key(rng)
        document = Account.encrypt(key, password, kdf=kdf, iterations=iterations)
        assert ethsig.decrypt_keystore(document, password) == bytes(
            Account.decrypt(document, password)
        )
        assert ethsig.decrypt_keystore(document, password) == key
        upper = json.loads(json.dumps(document).replace('"crypto"', '"Crypto"'))
        assert ethsig.decrypt_keystore(upper, password) == key
        with pytest.raises(ValueError, match="MAC mismatch"):
            ethsig.decrypt_keystore(document, password + "x")


def test_keystores_load_as_signer_and_as_account(tmp_path: Any) -> None:
    path = tmp_path / "keystore.json"
    address = create_keystore(path, "pw", kdf="pbkdf2", iterations=10)
    signer = load_signer(path, "pw")
    assert signer.address == address == load_account(path, "pw").address
    with pytest.raises(KeystoreError, match="wrong password"):
        load_signer(path, "nope")
    document = json.loads(path.read_text())
    del document["crypto"]["kdfparams"]
    path.write_text(json.dumps(document))
    with pytest.raises(KeystoreError, match="not a valid keystore"):
        load_signer(path, "pw")
