"""CIDs compared as binary CIDs (gridmarket.cid.same_cid, cid_matches), checked against what the
real js-ipfs daemon builds, in every text encoding."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from multiformats import CID

from gridmarket.cid import V0, CidError, bytes_cid, cid_matches, normalize_cid, same_cid

BASES = ["base32", "base58btc", "base16", "base36"]


def forms(cid: str) -> list[str]:
    parsed = CID.decode(cid)
    return [str(parsed.set(base=b)) for b in BASES]


def test_every_encoding_of_one_cid_is_the_same_cid() -> None:
    cid = bytes_cid(b"hello")
    assert len(set(forms(cid))) == len(BASES)  # four different strings
    for a in forms(cid):
        for b in forms(cid):
            assert same_cid(a, b)
    # CIDv0 and the CIDv1 dag-pb CID with its multihash address the same block
    v0 = bytes_cid(b"hello", V0)
    v1 = str(CID("base58btc", 1, "dag-pb", CID.decode(v0).digest))
    assert v1.startswith("z") and same_cid(v0, v1)


def test_different_content_or_codec_is_not_the_same_cid() -> None:
    a, b = bytes_cid(b"hello"), bytes_cid(b"hellO")
    assert not same_cid(a, b)
    raw = CID.decode(a)
    as_dag_pb = str(CID("base32", 1, "dag-pb", raw.digest))  # same digest, other codec
    assert not same_cid(a, as_dag_pb)
    with pytest.raises(CidError, match="not a CID"):
        same_cid(a, "zb2-not-a-cid")


def test_bytes_match_their_cid_in_every_encoding(ipfs_client: Any) -> None:
    """What js-ipfs builds: raw-leaf CIDv1 (bafk...) and CIDv0 (Qm...), one chunk and several."""
    for data in (b"spec bytes", os.urandom(600_000)):
        add = ipfs_client.add
        v1 = add(io.BytesIO(data), only_hash=True, cid_version=1, raw_leaves=True)["Hash"]
        v0 = add(io.BytesIO(data), only_hash=True)["Hash"]
        # js-ipfs answers CIDv1 in base58btc (zb2...): the form of issue 11
        assert v0.startswith("Qm") and v1.startswith("z")
        assert normalize_cid(v1).startswith("bafk" if len(data) < 262144 else "bafy")
        for cid in [*forms(v1), v0]:
            assert cid_matches(data, cid), cid
            assert not cid_matches(data + b"!", cid), cid
