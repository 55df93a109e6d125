"""The JSON API's uploads under ``/api/uploads``: a dataset (one directory on IPFS, the job's
``/input``) and a WASM module, each capped at ``upload_max_bytes``; the answer is the CID.
Errors as in :mod:`frontend_api.api` (400 naming the field, 413 over the cap)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from starlette.datastructures import UploadFile

from .api import BackendDep, add_spec
from .backend import Backend
from .forms import FieldError

router = APIRouter(prefix="/api", tags=["api"])

WASM_MAGIC = b"\0asm"
MAX_UPLOAD_FILES = 10_000


def _check_length(request: Request, b: Backend) -> None:
    length = request.headers.get("content-length")
    if (
        length is not None
        and length.isdigit()
        and int(length) > b.settings.upload_max_bytes + 65536
    ):
        raise HTTPException(
            413, f"upload of {length} bytes is over the {b.settings.upload_max_bytes}-byte cap"
        )


def _safe_relpath(name: str) -> PurePosixPath:
    """A file's path inside the dataset (browsers send folder uploads as ``dir/sub/file``)."""
    path = PurePosixPath(name.replace("\\", "/"))
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts or path.is_absolute() or any(p == ".." or "\0" in p for p in parts):
        raise FieldError("files", f"unsafe file name {name!r}")
    return PurePosixPath(*parts)


async def _save(upload: UploadFile, target: Path, budget: list[int], cap: int) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with target.open("xb") as out:
        while chunk := await upload.read(1024 * 1024):
            written += len(chunk)
            budget[0] += len(chunk)
            if budget[0] > cap:
                raise HTTPException(413, f"upload is over the {cap}-byte cap")
            out.write(chunk)
    return written


@router.post("/uploads/dataset")
async def upload_dataset(request: Request, b: BackendDep) -> dict[str, Any]:
    """A dataset (multipart field ``files``, one or more; folder uploads keep their relative
    paths) added to IPFS as one directory: the job sees it at ``/input``. Its CID."""
    _check_length(request, b)
    form = await request.form(max_files=MAX_UPLOAD_FILES)
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not files:
        raise FieldError("files", "choose at least one file (multipart field 'files')")
    work = Path(tempfile.mkdtemp(prefix="gm-upload-"))
    try:
        root = work / "dataset"
        root.mkdir()
        budget = [0]
        names: list[str] = []
        relpaths = [_safe_relpath(f.filename or "") for f in files]
        # A folder upload arrives as "<folder>/<file>": the folder itself is the dataset.
        tops = {p.parts[0] for p in relpaths}
        strip = len(tops) == 1 and all(len(p.parts) > 1 for p in relpaths)
        for upload, rel in zip(files, relpaths, strict=True):
            rel = PurePosixPath(*rel.parts[1:]) if strip else rel
            target = root.joinpath(*rel.parts)
            if target.exists():
                raise FieldError("files", f"{rel} is given twice")
            await _save(upload, target, budget, b.settings.upload_max_bytes)
            names.append(str(rel))
        cid = await asyncio.to_thread(_add_dir, b, root)
        return {"cid": cid, "files": sorted(names), "bytes": budget[0]}
    finally:
        await form.close()
        shutil.rmtree(work, ignore_errors=True)


def _add_dir(b: Backend, path: Path) -> str:
    with b.ipfs() as store:
        return store.add_dir(path)


@router.post("/uploads/module")
async def upload_module(request: Request, b: BackendDep) -> dict[str, Any]:
    """A WASM module (multipart field ``file``: a ``.wasm`` WASI command) added to IPFS; its
    CID, for ``module_cid``."""
    _check_length(request, b)
    form = await request.form(max_files=1)
    upload = form.get("file")
    try:
        if not isinstance(upload, UploadFile):
            raise FieldError("file", "choose a .wasm file (multipart field 'file')")
        data = await upload.read(b.settings.upload_max_bytes + 1)
        if len(data) > b.settings.upload_max_bytes:
            raise HTTPException(413, f"module is over the {b.settings.upload_max_bytes}-byte cap")
        if not data.startswith(WASM_MAGIC):
            raise FieldError("file", f"{upload.filename!r} is not a WebAssembly module (no \\0asm)")
        cid = await asyncio.to_thread(add_spec, b, data)
        return {"cid": cid, "bytes": len(data), "name": upload.filename}
    finally:
        await form.close()
