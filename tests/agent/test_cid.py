"""gridmarket.cid against the real js-ipfs daemon: the same CIDs, byte for byte."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import ipfshttpclient
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridmarket.cid import (
    CHUNK_SIZE,
    MAX_LINKS,
    V0,
    V1,
    CidError,
    CidParams,
    bytes_cid,
    normalize_cid,
    params_for,
    path_cid,
)

CHUNK = CHUNK_SIZE


def daemon_file_cid(client: ipfshttpclient.Client, data: bytes, params: CidParams) -> str:
    kwargs: dict[str, object] = {"only_hash": True}
    if params.version == 1:
        kwargs.update(cid_version=1, raw_leaves=params.raw_leaves)
    if params.chunk_size != CHUNK:
        kwargs["chunker"] = f"size-{params.chunk_size}"
    return normalize_cid(client.add(io.BytesIO(data), **kwargs)["Hash"])


def daemon_dir_cid(client: ipfshttpclient.Client, path: Path, params: CidParams) -> str:
    kwargs: dict[str, object] = {"recursive": True, "period_special": False, "only_hash": True}
    if params.version == 1:
        kwargs.update(cid_version=1, raw_leaves=params.raw_leaves)
    entries = client.add(str(path), **kwargs)
    entries = entries if isinstance(entries, list) else [entries]
    return normalize_cid(next(e["Hash"] for e in entries if e["Name"] == path.name))


def _bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


# ------------------------------------------------------------------ no daemon needed


def test_known_cids_of_the_empty_file_and_directory(tmp_path: Path) -> None:
    assert bytes_cid(b"", V0) == "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
    assert bytes_cid(b"") == "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert path_cid(tmp_path, V0) == "QmUNLLsPACCz1vLxQVkXqqLX5R1X345qqfHbsf67hvA3Nn"


def test_normalize_and_params() -> None:
    v1_b58 = "zb2rhmy65F3REf8SZp7De11gxtECBGgUKaLdiDj7MCGCHxbDW"
    assert normalize_cid(v1_b58) == "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert params_for("QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH") == [V0]
    assert params_for(v1_b58) == [V1]
    with pytest.raises(CidError, match="not a CID"):
        normalize_cid("not-a-cid")
    with pytest.raises(CidError):
        CidParams(version=0, raw_leaves=True)


def test_parses_are_remembered_and_refusals_are_not() -> None:
    v1_b58 = "zb2rhmy65F3REf8SZp7De11gxtECBGgUKaLdiDj7MCGCHxbDW"
    normalize_cid(v1_b58)
    hits = normalize_cid.cache_info().hits
    assert normalize_cid(v1_b58) == "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert normalize_cid.cache_info().hits == hits + 1
    for _ in range(2):  # refused both times: an exception is never remembered
        with pytest.raises(CidError, match="not a CID"):
            normalize_cid("still-not-a-cid")
    assert normalize_cid.cache_info().maxsize == 16_384


def test_symlinks_have_no_cid(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc/hostname")
    with pytest.raises(CidError, match="symlink"):
        path_cid(tmp_path)


# ------------------------------------------------------------------ against the daemon

SIZES = [0, 1, 1000, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("params", [V0, V1], ids=["v0", "v1-raw"])
def test_file_cids_match_the_daemon(
    ipfs_client: ipfshttpclient.Client, size: int, params: CidParams
) -> None:
    data = _bytes(size, size)
    assert bytes_cid(data, params) == daemon_file_cid(ipfs_client, data, params)


def test_cidv1_without_raw_leaves_matches(ipfs_client: ipfshttpclient.Client) -> None:
    data = _bytes(2 * CHUNK + 5)
    params = CidParams(version=1, raw_leaves=False)
    assert bytes_cid(data, params) == daemon_file_cid(ipfs_client, data, params)


def test_two_level_tree_with_default_chunks(ipfs_client: ipfshttpclient.Client) -> None:
    """175 chunks (43.5 MiB + 1 byte): the root links a full 174-leaf node and a 1-leaf node."""
    data = _bytes(MAX_LINKS * CHUNK + 1, 7)
    for params in (V1, V0):
        assert bytes_cid(data, params) == daemon_file_cid(ipfs_client, data, params)


@pytest.mark.parametrize("chunks", [MAX_LINKS, MAX_LINKS + 1, 2 * MAX_LINKS + 3])
def test_balanced_layout_with_small_chunks(ipfs_client: ipfshttpclient.Client, chunks: int) -> None:
    """The same layout cheaply: 1 KiB chunks, around and past one full node of 174 links."""
    data = _bytes(chunks * 1024 - 3, chunks)
    for params in (CidParams(chunk_size=1024), CidParams(0, False, chunk_size=1024)):
        assert bytes_cid(data, params) == daemon_file_cid(ipfs_client, data, params)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=6000), chunk=st.sampled_from([64, 256, 1000]))
def test_property_any_bytes_any_chunk(
    ipfs_client: ipfshttpclient.Client, data: bytes, chunk: int
) -> None:
    params = CidParams(chunk_size=chunk)
    assert bytes_cid(data, params) == daemon_file_cid(ipfs_client, data, params)


def _tree(root: Path) -> Path:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a" / "x.txt").write_text("x")
    (root / "a" / "b" / "big.bin").write_bytes(_bytes(2 * CHUNK + 11, 3))
    (root / "a" / "b" / "c" / "zero").write_bytes(b"")
    (root / ".hidden").write_text("dot files count too")
    (root / "Ünïcödé ☃.txt").write_text("names are UTF-8 and sorted by bytes")
    (root / "B-upper").write_text("sorts before a-lower")
    exe = root / "run.sh"
    exe.write_bytes(_bytes(CHUNK + 1, 4))
    exe.chmod(0o755)  # modes are not recorded: the CID must not change
    os.chmod(root / "a", 0o700)
    return root


@pytest.mark.parametrize("params", [V0, V1], ids=["v0", "v1-raw"])
def test_nested_directory_cids_match_the_daemon(
    ipfs_client: ipfshttpclient.Client, tmp_path: Path, params: CidParams
) -> None:
    tree = _tree(tmp_path / "tree")
    assert path_cid(tree, params) == daemon_dir_cid(ipfs_client, tree, params)


def test_empty_directory(ipfs_client: ipfshttpclient.Client, tmp_path: Path) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    for params in (V0, V1):
        assert path_cid(empty, params) == daemon_dir_cid(ipfs_client, empty, params)
