"""The submitter CLI's files: a job's dataset and WASM module uploaded through the front end
(their CIDs checked against the local bytes), and an output downloaded through its IPFS proxy."""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

import httpx

from .submitter_client import CliError, Frontend


def upload_dataset(fe: Frontend, path: Path) -> str:
    """Upload a file or folder as the job's dataset; the CID, checked against the local bytes."""
    from gridmarket.cid import path_cid

    if path.is_file():
        files = [(path.name, path)]
    else:
        files = []
        for item in sorted(path.rglob("*")):
            if item.is_symlink():
                raise CliError(f"dataset: {item} is a symbolic link; copy the file instead")
            if item.is_file():
                files.append((f"{path.name}/{item.relative_to(path).as_posix()}", item))
        if not files:
            raise CliError(f"dataset: {path} holds no file")
    handles = [(name, p.open("rb")) for name, p in files]
    try:
        body = fe.post(
            "/api/uploads/dataset", files=[("files", (name, fh)) for name, fh in handles]
        )
    finally:
        for _, fh in handles:
            fh.close()
    cid = str(body["cid"])
    if path.is_dir():
        local = path_cid(path)
        if local != cid:
            raise CliError(
                f"dataset: IPFS holds it as {cid} but {path} hashes to {local} "
                "(empty folders are not uploaded: remove them)"
            )
    return cid


def upload_module(fe: Frontend, path: Path) -> str:
    from gridmarket.cid import bytes_cid

    if path.suffix == ".wat":
        import wasmtime

        try:
            data = bytes(wasmtime.wat2wasm(path.read_text(encoding="utf-8")))
        except Exception as exc:  # wasmtime raises its own error type for bad text
            raise CliError(f"module: {path} does not compile: {str(exc).splitlines()[0]}") from None
    else:
        data = path.read_bytes()
    body = fe.post("/api/uploads/module", files={"file": (path.with_suffix(".wasm").name, data)})
    cid = str(body["cid"])
    if cid != bytes_cid(data):
        raise CliError(f"module: IPFS holds it as {cid}, not as its bytes' CID {bytes_cid(data)}")
    return cid


def download(fe: Frontend, cid: str, dest: Path) -> Path:
    """``cid`` through the front end's IPFS proxy (a tar for a folder), unpacked into ``dest``."""
    with tempfile.TemporaryDirectory(prefix="gm-get-") as tmp:
        raw = Path(tmp) / "download"
        try:
            with fe.stream("GET", f"/ipfs/{cid}", params={"archive": "tar"}) as response:
                if response.status_code >= 400:
                    response.read()
                    raise CliError(f"download of {cid}: {response.text[:300]}")
                kind = response.headers.get("x-ipfs-kind", "")
                with raw.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise CliError(f"download of {cid} failed: {exc}") from None
        dest.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            target = dest / cid
            shutil.move(str(raw), target)
            return target
        try:
            with tarfile.open(raw) as archive:
                archive.extractall(dest, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise CliError(f"download of {cid} is not a valid archive: {exc}") from None
        return dest
