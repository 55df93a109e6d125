"""Build ``gridmarket/python-torch:test``: Debian bookworm's python3 and PyTorch 1.13 (CPU),
offline, with no Dockerfile, for the training example (examples/python/train_mlp.py).

The .debs are the dependency closure of ``python3-minimal python3-torch`` that
scripts/setup_services.sh caches under ``.cache/debs/python-torch/`` (``closure.txt`` lists them):
about 390 packages and 260 MB, because Debian's ``libtorch1.13`` links OpenCV, FFmpeg, GDAL, Qt
and more, and ``python3-torch`` depends on ``libtorch-test``. Most of it is never loaded, so the
root file system keeps:

- every file of the Python packages (``python3*``, ``libpython3*``) and of ``libc6`` (the loader,
  gconv), without docs, man pages, test suites (``*/tests/``) and torch's C++ test binaries,
  headers and CMake files (``torch/{bin,include,share}``; ``torch/bin/torch_shm_manager``
  stays: ``import torch`` checks that it is there);
- of every other package only the shared libraries in the ELF ``DT_NEEDED`` closure of those
  Python files (the interpreter, each extension module, and ``torch/lib/libtorch_global_deps.so``,
  which ``import torch`` loads with ctypes), with the symlinks that lead to them. So
  ``libtorch-test``, Mesa, LLVM, the fonts, tzdata, GDAL's data and the rest stay out.

Like :func:`devstack.images.ensure_python_image` it makes the links maintainer scripts would
(the BLAS and LAPACK alternatives), adds ``/etc/passwd`` with ``nobody`` 65534, ``/tmp``,
``/input``, ``/output`` and ``/checkpoint``: that is :data:`BASE_IMAGE`, labelled with the
SHA-256 of the .debs and this builder's layout version. The script is a layer of its own on top
(:data:`TRAIN_SCRIPT_IN_IMAGE`), labelled with the base's id and the script's hash, so editing
the script rebuilds only that layer. Because each test session starts a fresh dockerd, the root
file system tar (~600 MB) is also kept under ``.cache/images/``, so that a later engine only
imports it (~6 s) instead of unpacking 390 .debs again (~45 s).

The ELF reader below is hand-written (40 lines of ``struct``): binutils' ``readelf`` is not part
of the set-up, and only ``DT_NEEDED`` of 64-bit little-endian files is needed.
"""

from __future__ import annotations

import hashlib
import io
import logging
import posixpath
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from devstack._process import ROOT, ServiceError
from devstack.images import _DEB_DIR, _PY_SKIP, RootfsTar, push_image, python_debs

__all__ = [
    "BASE_IMAGE",
    "TORCH_IMAGE",
    "TRAIN_SCRIPT_IN_IMAGE",
    "elf_needed",
    "ensure_torch_image",
    "publish_torch_image",
    "torch_debs",
]

log = logging.getLogger(__name__)

TORCH_IMAGE = "gridmarket/python-torch:test"
BASE_IMAGE = "gridmarket/python-torch-base:test"
TRAIN_SCRIPT_IN_IMAGE = "/opt/gridmarket/train_mlp.py"
_LABEL = "org.gridmarket.python-torch-sha256"  # of the base image's id and the script
_BASE_LABEL = "org.gridmarket.python-torch-debs-sha256"
_TORCH_DEB_DIR = _DEB_DIR / "python-torch"
_SCRIPT = ROOT / "examples" / "python" / "train_mlp.py"
_ROOTFS_CACHE = ROOT / ".cache" / "images"
_LAYOUT = "3"  # bump when the root file system's layout below changes: rebuilds the image
_DIST = "usr/lib/python3/dist-packages/"
# Under dist-packages: test suites, torch's C++ test binaries, headers and CMake files.
_SKIP_PARTS = ("/tests/", "/torch/bin/", "/torch/include/", "/torch/share/")
# `import torch` checks that torch_shm_manager (the helper of torch.multiprocessing) exists.
_KEEP = frozenset({_DIST + "torch/bin/torch_shm_manager"})
_CTYPES_ROOTS = (_DIST + "torch/lib/libtorch_global_deps.so",)  # loaded by `import torch`


def torch_debs(deb_dir: Path = _TORCH_DEB_DIR) -> list[Path]:
    """The cached .debs of the python3 + torch closure, as ``closure.txt`` lists them."""
    try:
        return python_debs(deb_dir)
    except ServiceError as exc:
        raise ServiceError(
            f"no complete python3-torch closure in {deb_dir}: run scripts/setup_services.sh "
            f"(apt-get download of python3-minimal python3-torch and their closure) ({exc})"
        ) from None


def elf_needed(data: bytes) -> list[str] | None:
    """The ``DT_NEEDED`` names of a 64-bit little-endian ELF file; None when ``data`` is not
    one. ValueError for a truncated or inconsistent one."""
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return None
    try:
        (phoff,) = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads: list[tuple[int, int, int]] = []
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            kind, _, offset, vaddr, _, filesz = struct.unpack_from(
                "<IIQQQQ", data, phoff + i * phentsize
            )
            if kind == 1:  # PT_LOAD
                loads.append((vaddr, offset, filesz))
            elif kind == 2:  # PT_DYNAMIC
                dynamic = (offset, filesz)
        if dynamic is None:
            return []
        strtab, wanted = None, []
        for at in range(dynamic[0], dynamic[0] + dynamic[1] - 15, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                wanted.append(value)
            elif tag == 5:  # DT_STRTAB (an address: mapped to a file offset by its PT_LOAD)
                strtab = value
        if strtab is None:
            return []
        base = next(off + strtab - va for va, off, size in loads if va <= strtab < va + size)
        names = []
        for value in wanted:
            start = base + value
            names.append(data[start : data.index(b"\0", start)].decode("ascii"))
        return names
    except (struct.error, StopIteration, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed ELF file: {exc!r}") from None


@dataclass
class _Entry:
    package: str
    kind: bytes
    target: str = ""  # a symlink's target, resolved to an archive path
    needed: tuple[str, ...] = ()


def _members(deb: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo, str]]:
    data = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as pkg:
        for member in pkg:
            name = member.name.removeprefix("./").rstrip("/")
            if name:
                yield pkg, member, name


def _package(deb: Path) -> str:
    return deb.name.split("_", 1)[0]


def _whole(package: str) -> bool:
    """Packages kept whole (less docs and tests): Python's and glibc's."""
    return package.startswith(("python3", "libpython3")) or package == "libc6"


def _skipped(name: str) -> bool:
    if name in _KEEP:
        return False
    return name.startswith(_PY_SKIP) or (
        name.startswith(_DIST) and any(part in f"/{name}/" for part in _SKIP_PARTS)
    )


def _index(debs: list[Path]) -> dict[str, _Entry]:
    """Every path of every .deb (first one wins), with symlink targets and ELF ``DT_NEEDED``."""
    entries: dict[str, _Entry] = {}
    for deb in debs:
        package = _package(deb)
        for pkg, member, name in _members(deb):
            if name in entries:
                continue
            entry = _Entry(package, member.type)
            if member.issym():
                target = member.linkname
                base = "" if target.startswith("/") else posixpath.dirname(name)
                entry.target = posixpath.normpath(posixpath.join(base, target.lstrip("/")))
            elif member.isfile() and (".so" in name or "/bin/" in f"/{name}"):
                handle = pkg.extractfile(member)
                data = handle.read() if handle is not None else b""
                try:
                    entry.needed = tuple(elf_needed(data) or ())
                except ValueError as exc:
                    raise ServiceError(f"{deb.name}: {name}: {exc}") from None
            entries[name] = entry
    return entries


def _closure(entries: dict[str, _Entry]) -> set[str]:
    """The paths to keep outside the whole packages: the shared libraries (and the symlinks to
    them) that the kept Python files need, transitively."""
    by_name: dict[str, list[str]] = {}
    for name in entries:
        by_name.setdefault(posixpath.basename(name), []).append(name)
    todo = [n for n, e in entries.items() if _whole(e.package) and not _skipped(n) and e.needed]
    todo += [n for n in _CTYPES_ROOTS if n in entries]
    keep: set[str] = set()
    while todo:
        name = todo.pop()
        for _ in range(40):  # follow a chain of symlinks, each link kept
            if name in keep or name not in entries:
                break
            keep.add(name)
            entry = entries[name]
            if entry.kind != tarfile.SYMTYPE:
                for lib in entry.needed:
                    todo.extend(by_name.get(lib, ()))
                break
            name = entry.target
    return keep


def _rootfs(debs: list[Path], out: Path) -> tuple[int, int]:
    """Write the image's root file system to the tar ``out``; returns (files, bytes of data)."""
    entries = _index(debs)
    closure = _closure(entries)
    with tarfile.open(out, mode="w") as tar:
        root = RootfsTar(tar)

        def parents(name: str) -> None:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                root.add("/".join(parts[:i]), tarfile.DIRTYPE, 0o755)

        for deb in debs:
            whole = _whole(_package(deb))
            if not whole and not any(entries[n].package == _package(deb) for n in closure):
                continue
            for pkg, member, name in _members(deb):
                if name in root.seen or member.isdir() or _skipped(name):
                    continue
                if not (whole or name in closure):
                    continue
                parents(name)
                root.member(pkg, member, name)
        root.finish(("checkpoint",))
    return root.files, root.size


def _digest(debs: list[Path]) -> str:
    h = hashlib.sha256(f"layout {_LAYOUT}\0".encode())
    for deb in sorted(debs):
        with deb.open("rb") as f:
            h.update(f"{deb.name}\0".encode() + hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


def _labelled(client: docker.DockerClient, tag: str, label: str, value: str) -> str | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return str(image.id) if (image.labels or {}).get(label) == value else None


def _base_image(client: docker.DockerClient, debs: list[Path], cache_dir: Path) -> str:
    """``gridmarket/python-torch-base:test``: the root file system without the script, imported
    from ``cache_dir`` (built from the .debs first when it is not there)."""
    digest = _digest(debs)
    found = _labelled(client, BASE_IMAGE, _BASE_LABEL, digest)
    if found:
        return found
    started = time.monotonic()
    cache_dir.mkdir(parents=True, exist_ok=True)
    rootfs = cache_dir / f"python-torch-{digest[:16]}.tar"
    if not rootfs.is_file():
        for stale in cache_dir.glob("python-torch-*.tar"):
            stale.unlink()
        with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".part", delete=False) as part:
            partial = Path(part.name)
        try:
            files, size = _rootfs(sorted(debs), partial)
            partial.rename(rootfs)
        finally:
            partial.unlink(missing_ok=True)
        log.info(
            "%s: %d files, %.1f MiB, in %.1f s",
            rootfs.name, files, size / 2**20, time.monotonic() - started,
        )  # fmt: skip
    repository, _, version = BASE_IMAGE.rpartition(":")
    client.api.import_image_from_file(
        str(rootfs),
        repository=repository,
        tag=version,
        changes=[
            "ENV PATH=/usr/local/bin:/usr/bin:/bin",
            "ENV LANG=C.UTF-8",
            "ENV PYTHONDONTWRITEBYTECODE=1",
            'CMD ["python3"]',
            "WORKDIR /",
            f"LABEL {_BASE_LABEL}={digest}",
        ],
    )
    image = client.images.get(BASE_IMAGE)
    log.info("imported %s (%s) in %.1f s", BASE_IMAGE, image.short_id, time.monotonic() - started)
    return str(image.id)


def ensure_torch_image(
    client: docker.DockerClient,
    tag: str = TORCH_IMAGE,
    debs: list[Path] | None = None,
    *,
    script: Path = _SCRIPT,
    cache_dir: Path = _ROOTFS_CACHE,
) -> str:
    """Make sure ``tag`` (python3 + torch, ``script`` at :data:`TRAIN_SCRIPT_IN_IMAGE`) exists
    in the engine, building it when the .debs or the script changed.

    Returns the image id. Fast (hashing ~260 MB of .debs, one API call) when it is already
    there. Otherwise the base image (:data:`BASE_IMAGE`, the .debs' root file system) is
    imported from the tar kept in ``cache_dir`` (built from the .debs first when they changed:
    ~45 s), and the script is added on top of it as a layer of its own (a container created,
    never started, the file put in, committed), so a changed script costs about a second.
    """
    debs = debs if debs is not None else torch_debs()
    code = script.read_bytes()
    base = _base_image(client, debs, cache_dir)
    digest = hashlib.sha256(f"{base}\0".encode() + code).hexdigest()
    found = _labelled(client, tag, _LABEL, digest)
    if found:
        return found
    started = time.monotonic()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo(posixpath.basename(TRAIN_SCRIPT_IN_IMAGE))
        info.mode, info.mtime, info.size = 0o755, int(time.time()), len(code)
        tar.addfile(info, io.BytesIO(code))
    container = client.containers.create(base, network_disabled=True)
    try:
        if not container.put_archive(posixpath.dirname(TRAIN_SCRIPT_IN_IMAGE), layer.getvalue()):
            raise ServiceError(f"could not add {TRAIN_SCRIPT_IN_IMAGE} to {BASE_IMAGE}")
        repository, _, version = tag.rpartition(":")
        container.commit(
            repository=repository,
            tag=version,
            changes=[
                f'CMD ["python3", "{TRAIN_SCRIPT_IN_IMAGE}"]',
                f"LABEL {_LABEL}={digest}",
            ],
        )
    finally:
        container.remove(force=True)
    image = client.images.get(tag)
    log.info("built %s (%s) in %.1f s", tag, image.short_id, time.monotonic() - started)
    return str(image.id)


def publish_torch_image(client: docker.DockerClient, registry: str) -> str:
    """Build (if needed) ``gridmarket/python-torch:test`` and push it to ``registry``: the
    pinned reference ``registry/gridmarket/python-torch@sha256:<hex>``."""
    ensure_torch_image(client)
    return push_image(client, registry, TORCH_IMAGE)
