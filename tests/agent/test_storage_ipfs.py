"""AgentIpfsStore against the real js-ipfs daemon: verified fetch, capped size, checked add."""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path

import ipfshttpclient
import pytest
from multiformats import CID

from agent.errors import DatasetTooLargeError, DatasetVerificationError, StorageError
from agent.storage import Storage
from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon
from gridmarket import cid as cidlib
from gridmarket.cid import V0, normalize_cid, path_cid


def _add_bytes(client: ipfshttpclient.Client, data: bytes, **kwargs: object) -> str:
    return normalize_cid(client.add(io.BytesIO(data), **kwargs)["Hash"])


def _tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "top.txt").write_text("top")
    (root / ".env").write_text("dot file")
    (root / "sub" / "blob.bin").write_bytes(random.Random(1).randbytes(600_000))
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    return root


def test_is_a_storage(storage: AgentIpfsStore) -> None:
    assert isinstance(storage, AgentIpfsStore)
    _: Storage = storage  # mypy checks the protocol


def test_add_dir_then_fetch_round_trip(storage: AgentIpfsStore, tmp_path: Path) -> None:
    tree = _tree(tmp_path / "out")
    root = storage.add_dir(tree)
    assert root.startswith("bafy") and root == path_cid(tree)

    fetched = storage.fetch(root, tmp_path / "in", max_bytes=1_000_000)
    assert fetched == tmp_path / "in"
    assert (fetched / "sub" / "blob.bin").read_bytes() == (tree / "sub" / "blob.bin").read_bytes()
    assert (fetched / ".env").read_text() == "dot file"
    assert (fetched / "sub" / "deeper" / "empty").stat().st_size == 0
    assert path_cid(fetched) == root
    assert oct((fetched / "top.txt").stat().st_mode & 0o777) == "0o644"  # readable by the job


def test_fetch_single_file_cids_v0_and_v1(
    storage: AgentIpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    data = random.Random(2).randbytes(300_000)
    for i, kwargs in enumerate([{}, {"cid_version": 1, "raw_leaves": True}, {"cid_version": 1}]):
        cid = _add_bytes(ipfs_client, data, **kwargs)
        path = storage.fetch(cid, tmp_path / f"in{i}", max_bytes=len(data))
        assert path == tmp_path / f"in{i}" / cid
        assert path.read_bytes() == data


def test_add_empty_dir(storage: AgentIpfsStore, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert storage.add_dir(empty) == path_cid(empty)


def test_add_refuses_symlinks(storage: AgentIpfsStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "shadow").symlink_to("/etc/shadow")
    with pytest.raises(StorageError, match="symlink"):
        storage.add_dir(out)


def test_oversized_file_is_refused_before_download(
    storage: AgentIpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    cid = _add_bytes(ipfs_client, b"x" * 10_001, cid_version=1, raw_leaves=True)
    dest = tmp_path / "in"
    with pytest.raises(DatasetTooLargeError, match="10001 bytes, over the 10000-byte cap"):
        storage.fetch(cid, dest, max_bytes=10_000)
    assert list(dest.iterdir()) == []


def test_oversized_directory_is_cut_off_while_streaming(
    storage: AgentIpfsStore, tmp_path: Path
) -> None:
    root = storage.add_dir(_tree(tmp_path / "tree"))
    dest = tmp_path / "in"
    with pytest.raises(DatasetTooLargeError, match="larger than the 100000-byte cap"):
        storage.fetch(root, dest, max_bytes=100_000)
    assert list(dest.iterdir()) == []  # nothing half-fetched is left for a job to read


def test_tampered_block_is_detected(
    storage: AgentIpfsStore,
    ipfs_client: ipfshttpclient.Client,
    ipfs_daemon: IpfsDaemon,
    tmp_path: Path,
) -> None:
    """Rewrite a block in the daemon's repository: js-ipfs serves it as is, we must not."""
    data = b"the real dataset\n" * 1000
    cid = _add_bytes(ipfs_client, data, cid_version=1, raw_leaves=True)
    key = base64.b32encode(bytes(CID.decode(cid).digest)).decode().rstrip("=")
    block = ipfs_daemon.repo / "blocks" / key[-3:-1] / f"{key}.data"
    assert block.read_bytes() == data
    block.write_bytes(data.replace(b"real", b"fake"))
    assert ipfs_client.cat(cid) != data  # the daemon does not notice

    dest = tmp_path / "in"
    with pytest.raises(DatasetVerificationError, match="tampered") as err:
        storage.fetch(cid, dest, max_bytes=1_000_000)
    assert cid in str(err.value)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("name", ["..", "a/b"])
def test_unsafe_names_in_a_crafted_directory(
    storage: AgentIpfsStore, ipfs_client: ipfshttpclient.Client, tmp_path: Path, name: str
) -> None:
    """A hand-made dag-pb directory whose link would write outside the job's input dir."""
    leaf = bytes(CID.decode(_add_bytes(ipfs_client, b"pwned", cid_version=1, raw_leaves=True)))
    node = cidlib._dag_pb(cidlib._unixfs(1), [(leaf, name, 5)])
    put = ipfs_client.block.put(io.BytesIO(node), opts={"format": "dag-pb", "version": 1})
    dest = tmp_path / "jobs" / "1" / "in"
    with pytest.raises(DatasetVerificationError, match="unsafe entry name"):
        storage.fetch(put["Key"], dest, max_bytes=1000)
    assert not (tmp_path / "jobs" / "1" / "pwned").exists()
    assert list(dest.iterdir()) == []


def test_unknown_cid_times_out_clearly(ipfs_daemon: IpfsDaemon, tmp_path: Path) -> None:
    missing = cidlib.bytes_cid(b"nobody ever added this " + random.randbytes(16), V0)
    with (
        AgentIpfsStore(ipfs_daemon.api_addr, resolve_timeout=1) as storage,
        pytest.raises(StorageError, match="timed out"),
    ):
        storage.fetch(missing, tmp_path / "in", max_bytes=1000)


def test_unreachable_daemon(tmp_path: Path) -> None:
    with (
        AgentIpfsStore("/ip4/127.0.0.1/tcp/9/http") as storage,
        pytest.raises(StorageError, match="unreachable"),
    ):
        storage.fetch(cidlib.bytes_cid(b"x"), tmp_path / "in", max_bytes=10)


def test_not_a_cid(storage: AgentIpfsStore, tmp_path: Path) -> None:
    with pytest.raises(DatasetVerificationError, match="not a CID"):
        storage.fetch("../../etc/passwd", tmp_path / "in", max_bytes=10)
