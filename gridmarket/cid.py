"""Recompute IPFS UnixFS CIDs from bytes, in pure Python: the check behind every verified CID.

What ``ipfs add`` builds, and so what :func:`path_cid` recomputes:

- a file is cut into fixed 256 KiB chunks (the default ``size-262144`` chunker);
- each chunk is a leaf: a *raw* block (CIDv1 with raw leaves) or a dag-pb node holding a UnixFS
  ``File`` with the bytes (CIDv0); a file of one chunk is that leaf;
- leaves are linked by a *balanced* tree of dag-pb UnixFS ``File`` nodes of at most 174 links;
- a directory is a dag-pb UnixFS ``Directory`` node linking its entries sorted by name bytes.

Identical to js-ipfs 0.66 (``add`` with ``cid_version=1, raw_leaves=True``, or the default CIDv0)
and to Kubo for files and directories without UnixFS mode/mtime metadata. Not covered: HAMT-sharded
directories (js-ipfs never shards unless told to; Kubo shards directory nodes over 256 KiB, about
3,000 entries), symlinks, the trickle layout and other chunkers than fixed-size ones.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from multiformats import CID

__all__ = [
    "CHUNK_SIZE",
    "MAX_LINKS",
    "V0",
    "V1",
    "CidError",
    "CidParams",
    "bytes_cid",
    "cid_matches",
    "file_cid",
    "normalize_cid",
    "params_for",
    "path_cid",
    "same_cid",
]

CHUNK_SIZE = 256 * 1024
"""Bytes per leaf: the default ``size-262144`` chunker of Kubo and js-ipfs."""
MAX_LINKS = 174
"""Links per internal node of the balanced file layout (Kubo and js-ipfs)."""

_DAG_PB = 0x70
_RAW = 0x55
_SHA2_256 = 0x12
# UnixFS Data.Type values (unixfs.proto)
_DIRECTORY = 1
_FILE = 2


class CidError(ValueError):
    """A CID that cannot be parsed, or a path whose CID cannot be computed (symlinks, devices)."""


@dataclass(frozen=True, slots=True)
class CidParams:
    """How a DAG was built: CID version, raw leaves, chunk size and fan-out."""

    version: int = 1
    raw_leaves: bool = True
    chunk_size: int = CHUNK_SIZE
    max_links: int = MAX_LINKS

    def __post_init__(self) -> None:
        if self.version not in (0, 1):
            raise CidError(f"CID version must be 0 or 1, not {self.version}")
        if self.version == 0 and self.raw_leaves:
            raise CidError("CIDv0 cannot address raw leaves: use raw_leaves=False with version 0")
        if self.chunk_size < 1 or self.max_links < 2:
            raise CidError(f"bad chunk_size {self.chunk_size} or max_links {self.max_links}")


V0 = CidParams(version=0, raw_leaves=False)
V1 = CidParams()


@dataclass(frozen=True, slots=True)
class _Node:
    cid: bytes  # binary CID, as stored in dag-pb links
    tsize: int  # encoded size of the whole sub-DAG (the link's Tsize)
    file_size: int  # UnixFS content bytes below this node (files only)


# ------------------------------------------------------------------ protobuf, by hand


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _field_bytes(field: int, value: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(value)) + value


def _unixfs(
    kind: int, data: bytes = b"", file_size: int | None = None, blocks: Iterable[int] = ()
) -> bytes:
    out = _field_varint(1, kind)
    if data:
        out += _field_bytes(2, data)
    if file_size is not None:
        out += _field_varint(3, file_size)
    for size in blocks:
        out += _field_varint(4, size)
    return out


def _dag_pb(data: bytes, links: Iterable[tuple[bytes, str, int]]) -> bytes:
    # dag-pb canonical form: Links (field 2) first, then Data (field 1); Name always present.
    out = b"".join(
        _field_bytes(
            2, _field_bytes(1, cid) + _field_bytes(2, name.encode()) + _field_varint(3, tsize)
        )
        for cid, name, tsize in links
    )
    return out + _field_bytes(1, data)


def _block_cid(block: bytes, codec: int, params: CidParams) -> bytes:
    multihash = bytes([_SHA2_256, 32]) + hashlib.sha256(block).digest()
    if params.version == 0:
        return multihash
    return b"\x01" + _varint(codec) + multihash


def _pb_node(
    data: bytes, links: Iterable[tuple[bytes, str, int]], params: CidParams
) -> tuple[bytes, int]:
    links = list(links)
    block = _dag_pb(data, links)
    return _block_cid(block, _DAG_PB, params), len(block) + sum(t for _, _, t in links)


# ------------------------------------------------------------------ files


def _leaf(chunk: bytes, params: CidParams) -> _Node:
    if params.raw_leaves:
        return _Node(_block_cid(chunk, _RAW, params), len(chunk), len(chunk))
    cid, tsize = _pb_node(_unixfs(_FILE, chunk, len(chunk)), (), params)
    return _Node(cid, tsize, len(chunk))


def _parent(children: list[_Node], params: CidParams) -> _Node:
    size = sum(c.file_size for c in children)
    data = _unixfs(_FILE, file_size=size, blocks=(c.file_size for c in children))
    cid, tsize = _pb_node(data, ((c.cid, "", c.tsize) for c in children), params)
    return _Node(cid, tsize, size)


def _chunks(stream: BinaryIO, size: int) -> Iterator[bytes]:
    while True:
        chunk = stream.read(size)
        # read() may return short of a full chunk before EOF (pipes): fill it up.
        while chunk and len(chunk) < size:
            more = stream.read(size - len(chunk))
            if not more:
                break
            chunk += more
        if not chunk:
            return
        yield chunk


def _file_node(stream: BinaryIO, params: CidParams) -> _Node:
    level = [_leaf(chunk, params) for chunk in _chunks(stream, params.chunk_size)]
    if not level:  # empty file: one empty leaf
        return _leaf(b"", params)
    if len(level) == 1:
        return level[0]
    # Bottom-up grouping by max_links builds the same tree as the depth-first balanced builder.
    while len(level) > 1:
        level = [
            _parent(level[i : i + params.max_links], params)
            for i in range(0, len(level), params.max_links)
        ]
    return level[0]


# ------------------------------------------------------------------ directories


def _path_node(path: Path, params: CidParams) -> _Node:
    st = path.lstat()
    if stat.S_ISREG(st.st_mode):
        with path.open("rb") as f:
            return _file_node(f, params)
    if stat.S_ISDIR(st.st_mode):
        return _dir_node(path, params)
    kind = "symlink" if stat.S_ISLNK(st.st_mode) else "special file"
    raise CidError(f"{path} is a {kind}: only regular files and directories have a CID here")


def _dir_node(path: Path, params: CidParams) -> _Node:
    with os.scandir(path) as it:
        names = sorted((entry.name for entry in it), key=os.fsencode)
    links = []
    for name in names:
        child = _path_node(path / name, params)
        links.append((child.cid, name, child.tsize))
    cid, tsize = _pb_node(_unixfs(_DIRECTORY), links, params)
    return _Node(cid, tsize, 0)


# ------------------------------------------------------------------ public API

_PARSED = 16_384
"""How many distinct CID texts :func:`normalize_cid` and :func:`_parse` remember. multiformats
checks every argument's type at run time (``typing_validation``): a parse and its re-encoding
cost ~0.5 ms, and the scheduler parses the same CIDs again and again (a spec CID per job, an
output CID per result, each once per check). A CID is immutable, and so is its text's parse."""


def _encode(cid: bytes, params: CidParams) -> str:
    if params.version == 0:
        return str(CID("base58btc", 0, "dag-pb", cid))
    return str(CID.decode(cid).set(base="base32"))


def file_cid(stream: BinaryIO, params: CidParams = V1) -> str:
    """The CID of the bytes read from ``stream`` to its end, as ``ipfs add`` would give."""
    return _encode(_file_node(stream, params).cid, params)


def bytes_cid(data: bytes, params: CidParams = V1) -> str:
    """The CID of ``data`` as a UnixFS file."""
    return file_cid(io.BytesIO(data), params)


def path_cid(path: str | os.PathLike[str], params: CidParams = V1) -> str:
    """The CID of a file or a directory tree (``ipfs add -r``), without following symlinks.

    Raises:
        CidError: the tree holds a symlink, a device, a socket or a FIFO.
        OSError: the path cannot be read.
    """
    return _encode(_path_node(Path(path), params).cid, params)


@functools.lru_cache(maxsize=_PARSED)
def normalize_cid(cid: str) -> str:
    """The canonical text of ``cid``: CIDv0 in base58btc, CIDv1 in base32 (``bafy...``).

    Remembered for the last ``_PARSED`` distinct texts (a pure function of its argument; a
    refusal is not remembered).

    Raises:
        CidError: ``cid`` is not a CID.
    """
    parsed = _parse(cid)
    if parsed.version == 0:
        return str(parsed)
    return str(parsed.set(base="base32"))


@functools.lru_cache(maxsize=_PARSED)
def _parse(cid: str) -> CID:
    try:
        return CID.decode(cid.strip())
    except Exception as exc:  # multiformats raises several unrelated types
        raise CidError(f"not a CID: {cid!r} ({exc})") from None


def same_cid(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same content, compared as binary CIDs, whatever their
    text encoding (``bafy...`` base32, ``zb2...`` base58btc, ``f01...`` base16, ...).

    The codec and the multihash decide; the CID version does not: a CIDv0 (``Qm...``) and the
    CIDv1 dag-pb CID with the same multihash address the same block.

    Raises:
        CidError: either is not a CID.
    """
    pa, pb = _parse(a), _parse(b)
    return pa.codec.code == pb.codec.code and bytes(pa.digest) == bytes(pb.digest)


def cid_matches(data: bytes, cid: str) -> bool:
    """Whether ``data``, added as a UnixFS file the way ``cid`` says it was built (version, raw
    or dag-pb leaves: :func:`params_for`), has the CID ``cid``, in any text encoding.

    Raises:
        CidError: ``cid`` is not a CID, or not one this module can recompute.
    """
    return any(same_cid(bytes_cid(data, p), cid) for p in params_for(cid))


def params_for(cid: str) -> list[CidParams]:
    """The build parameters that may have produced ``cid``, most likely first.

    A CIDv0 means dag-pb leaves. A CIDv1 is usually built with raw leaves, but js-ipfs also makes
    CIDv1 DAGs with dag-pb leaves (``cid_version=1`` without ``raw_leaves``): both are returned.
    """
    parsed = CID.decode(normalize_cid(cid))
    if parsed.hashfun.name != "sha2-256":
        raise CidError(f"{cid}: only sha2-256 CIDs can be recomputed, not {parsed.hashfun.name}")
    if parsed.version == 0:
        return [V0]
    if parsed.codec.name == "raw":
        return [V1]
    if parsed.codec.name != "dag-pb":
        raise CidError(f"{cid}: codec {parsed.codec.name} is not UnixFS (dag-pb or raw)")
    return [V1, CidParams(version=1, raw_leaves=False)]
