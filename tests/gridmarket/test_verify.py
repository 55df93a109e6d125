"""Output verification (gridmarket/verify.py) against the real js-ipfs daemon.

Every case checks the verdict's code, that its message names the CID and what failed, that the
fetched copy is gone from ``work_dir`` afterwards, and that the shared store is left as it was.
"""

from __future__ import annotations

import base64
import io
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ipfshttpclient
import pytest
from multiformats import CID, multihash

from devstack.ipfs import IpfsDaemon
from gridmarket.cid import V0, bytes_cid, normalize_cid, path_cid
from gridmarket.ipfs import IpfsStore
from gridmarket.verify import Verdict, VerdictCode, verify_output

TIMEOUT_S = 2.0
SLACK_S = 2.0  # scheduling noise on a loaded 2-core machine


@pytest.fixture
def store(ipfs_daemon: IpfsDaemon) -> Iterator[IpfsStore]:
    with IpfsStore(ipfs_daemon.api_addr, resolve_timeout=30) as store:
        yield store


def _tree(root: Path, seed: int) -> Path:
    """A nested output: a multi-block file (3 leaves), a small file, an empty file."""
    rng = random.Random(seed)
    (root / "logs").mkdir(parents=True)
    (root / "result.bin").write_bytes(rng.randbytes(600_000))
    (root / "logs" / "run.txt").write_text(f"run {seed} ok\n")
    (root / "logs" / "empty").write_bytes(b"")
    return root


def _verify(store: IpfsStore, cid: str, work: Path, max_bytes: int = 10_000_000) -> Verdict:
    before = store.resolve_timeout
    verdict = verify_output(store, cid, max_bytes=max_bytes, timeout_s=TIMEOUT_S, work_dir=work)
    assert not work.exists() or list(work.iterdir()) == [], "verify_output left files behind"
    assert store.resolve_timeout == before, "verify_output changed the shared store"
    return verdict


def _add(client: ipfshttpclient.Client, data: bytes, **kwargs: object) -> str:
    return normalize_cid(client.add(io.BytesIO(data), **kwargs)["Hash"])


def test_good_directory_output_is_accepted(store: IpfsStore, tmp_path: Path) -> None:
    tree = _tree(tmp_path / "out", seed=1)
    cid = store.add_dir(tree)
    verdict = _verify(store, cid, tmp_path / "work")
    assert verdict.ok and verdict.code is VerdictCode.OK, verdict.message
    assert (verdict.bytes, verdict.files) == (600_000 + len("run 1 ok\n"), 3)
    assert cid in verdict.message


def test_output_exactly_at_the_cap_is_accepted(store: IpfsStore, tmp_path: Path) -> None:
    cid = store.add_dir(_tree(tmp_path / "out", seed=2))
    assert _verify(store, cid, tmp_path / "work", max_bytes=600_000 + len("run 2 ok\n")).ok


def test_cidv0_and_cidv1_of_the_same_tree_both_verify(
    store: IpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    tree = _tree(tmp_path / "out", seed=3)
    added = ipfs_client.add(str(tree), recursive=True)  # js-ipfs default: CIDv0
    v0 = normalize_cid([e for e in added if e["Name"] == "out"][-1]["Hash"])
    v1 = store.add_dir(tree)  # CIDv1, raw leaves
    assert v0.startswith("Qm") and v0 == path_cid(tree, V0)
    assert v1.startswith("bafy") and v1 == path_cid(tree)
    verdicts = [_verify(store, cid, tmp_path / "work") for cid in (v0, v1)]
    assert all(v.ok for v in verdicts), [v.message for v in verdicts]
    assert verdicts[0].bytes == verdicts[1].bytes and verdicts[0].files == verdicts[1].files == 3
    # the same CIDv1 in another multibase is the same output
    other_base = str(CID.decode(v1).set(base="base58btc"))
    assert _verify(store, other_base, tmp_path / "work").ok


def test_single_file_output_is_accepted(
    store: IpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    data = random.Random(4).randbytes(300_000)
    cid = _add(ipfs_client, data, cid_version=1, raw_leaves=True)
    verdict = _verify(store, cid, tmp_path / "work")
    assert verdict.ok and (verdict.bytes, verdict.files) == (300_000, 1)


def test_content_the_daemon_does_not_have_is_unreachable_within_the_timeout(
    store: IpfsStore, tmp_path: Path
) -> None:
    nonce = random.randbytes(16)
    for cid in (bytes_cid(b"never added " + nonce), bytes_cid(b"never added " + nonce, V0)):
        started = time.monotonic()
        verdict = _verify(store, cid, tmp_path / "work")
        took = time.monotonic() - started
        assert verdict.code is VerdictCode.UNREACHABLE, verdict.message
        assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + SLACK_S, f"took {took:.2f} s"
        assert cid in verdict.message and "timed out" in verdict.message
    # the store still works afterwards
    assert _verify(store, store.add_dir(_tree(tmp_path / "out", seed=5)), tmp_path / "work").ok


def test_a_daemon_that_is_down_is_unreachable_at_once(tmp_path: Path) -> None:
    with IpfsStore("/ip4/127.0.0.1/tcp/9/http") as down:
        started = time.monotonic()
        verdict = _verify(down, bytes_cid(b"x"), tmp_path / "work")
    assert verdict.code is VerdictCode.UNREACHABLE and "unreachable" in verdict.message
    assert time.monotonic() - started < TIMEOUT_S


def test_oversize_outputs_are_too_large(
    store: IpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    tree_cid = store.add_dir(_tree(tmp_path / "out", seed=6))
    verdict = _verify(store, tree_cid, tmp_path / "work", max_bytes=600_000)  # cut off mid-stream
    assert verdict.code is VerdictCode.TOO_LARGE and "600000-byte cap" in verdict.message
    assert tree_cid in verdict.message and verdict.bytes == 0
    file_cid = _add(ipfs_client, b"y" * 5_001 + random.randbytes(8), cid_version=1, raw_leaves=True)
    verdict = _verify(store, file_cid, tmp_path / "work", max_bytes=5_000)  # refused by size
    assert verdict.code is VerdictCode.TOO_LARGE and "5009 bytes, over the 5000-byte cap" in (
        verdict.message
    )


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "not-a-cid",
        "../../etc/passwd",
        "QmShort",
        "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzd",  # one character short
        str(CID("base32", 1, "dag-cbor", multihash.digest(b"x", "sha2-256"))),  # not UnixFS
        str(CID("base32", 1, "raw", multihash.digest(b"x", "sha3-256"))),  # not recomputable
    ],
)
def test_malformed_or_unusable_cids_are_invalid(store: IpfsStore, tmp_path: Path, bad: str) -> None:
    started = time.monotonic()
    verdict = _verify(store, bad, tmp_path / "work")
    assert verdict.code is VerdictCode.INVALID, verdict.message
    assert repr(bad) in verdict.message
    assert time.monotonic() - started < 1  # decided without asking the daemon


def test_bytes_that_do_not_hash_to_the_cid_are_a_mismatch(
    store: IpfsStore,
    ipfs_client: ipfshttpclient.Client,
    ipfs_daemon: IpfsDaemon,
    tmp_path: Path,
) -> None:
    """A block rewritten in the daemon's repository: js-ipfs serves it as is."""
    data = b"the provider's real output\n" * 500 + random.randbytes(16)
    cid = _add(ipfs_client, data, cid_version=1, raw_leaves=True)
    key = base64.b32encode(bytes(CID.decode(cid).digest)).decode().rstrip("=")
    block = ipfs_daemon.repo / "blocks" / key[-3:-1] / f"{key}.data"
    block.write_bytes(data.replace(b"real", b"fake"))
    verdict = _verify(store, cid, tmp_path / "work")
    assert verdict.code is VerdictCode.CID_MISMATCH and cid in verdict.message


def test_a_dag_built_with_other_options_is_a_mismatch(
    store: IpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    """A 1,000-byte chunker: the daemon serves it, but the CID cannot be recomputed here."""
    data = random.Random(7).randbytes(5_000)
    cid = _add(ipfs_client, data, cid_version=1, raw_leaves=True, chunker="size-1000")
    assert cid != bytes_cid(data)
    verdict = _verify(store, cid, tmp_path / "work")
    assert verdict.code is VerdictCode.CID_MISMATCH and "chunker" in verdict.message


def test_a_tree_missing_a_block_is_unreachable_within_the_timeout(tmp_path: Path) -> None:
    """The root is there, one chunk of a file is not: the read stalls mid-stream.

    On a private daemon: js-ipfs 0.66 exits when a client drops a streamed cat that is waiting
    for a block (docs/scheduler-verify.md), which would take the session's daemon down.
    """
    with IpfsDaemon(tmp_path / "ipfs") as daemon, IpfsStore(daemon.api_addr) as store:
        root = store.add_dir(_tree(tmp_path / "out", seed=8))
        client = ipfshttpclient.Client(daemon.api_addr)
        (entry,) = [e for e in client.ls(root)["Objects"][0]["Links"] if e["Name"] == "result.bin"]
        chunk = client.object.links(entry["Hash"])["Links"][1]["Hash"]
        client.pin.rm(root)
        removed = httpx.post(f"{daemon.api_url}/api/v0/block/rm", params={"arg": chunk})
        assert removed.status_code == 200, removed.text
        client.close()
        started = time.monotonic()
        verdict = _verify(store, root, tmp_path / "work")
        took = time.monotonic() - started
    assert verdict.code is VerdictCode.UNREACHABLE, verdict.message
    assert took < TIMEOUT_S + SLACK_S, f"took {took:.2f} s"
    assert root in verdict.message and "timed out" in verdict.message
