"""Build the local test images ``gridmarket/busybox:test`` and ``gridmarket/python-numpy:test``,
and push images to a local registry.

The root file system is Debian's static busybox (``busybox-static``, the .deb that
scripts/setup_services.sh caches under ``.cache/debs/``) with a symlink per applet, plus
``/etc/passwd`` (root and ``nobody`` 65534), ``/tmp``, ``/input`` and ``/output``. It is
imported with ``docker import`` semantics (``POST /images/create?fromSrc=-``); a label records the
.deb's SHA-256 so a different busybox rebuilds the image and an unchanged one is reused.

:func:`push_image` pushes an image of the engine to a registry (devstack/registry.py) and returns
the reference jobs carry, ``127.0.0.1:<port>/gridmarket/busybox@sha256:<hex>``;
:func:`ensure_busybox_image` with ``extra_files`` builds a variant (its own layer, its own digest).

``gridmarket/python-numpy:test`` (:func:`ensure_python_image`) is Debian's python3 and numpy with
no shell and no package manager: the data tarballs of the dependency closure of
``python3-minimal python3-numpy`` (the .debs scripts/setup_services.sh caches under
``.cache/debs/python-numpy/``, listed in its ``closure.txt``) merged into one root file system,
without maintainer scripts, so the two links they would make are made here (the BLAS and LAPACK
alternatives ``libblas.so.3``, ``liblapack.so.3``), and docs, man pages and numpy's own tests are
left out. The example analysis examples/python/hours_regression.py is baked in at
``/opt/gridmarket/hours_regression.py``. Offline, no Dockerfile; cached like busybox: a label
holds the SHA-256 of the .debs, the script and this builder's layout version.
"""

from __future__ import annotations

import hashlib
import io
import logging
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors

from devstack._process import ROOT, ServiceError

__all__ = [
    "BUSYBOX_IMAGE",
    "PYTHON_IMAGE",
    "PYTHON_SCRIPT_IN_IMAGE",
    "busybox_deb",
    "ensure_busybox_image",
    "ensure_python_image",
    "publish_busybox",
    "publish_python_image",
    "push_image",
    "python_debs",
]

log = logging.getLogger(__name__)

BUSYBOX_IMAGE = "gridmarket/busybox:test"
_LABEL = "org.gridmarket.busybox-deb-sha256"
_DEB_DIR = ROOT / ".cache" / "debs"


def busybox_deb(deb_dir: Path = _DEB_DIR) -> Path:
    """The cached busybox-static .deb (scripts/setup_services.sh downloads it)."""
    found = sorted(deb_dir.glob("busybox-static_*.deb"))
    if not found:
        raise ServiceError(
            f"no busybox-static .deb in {deb_dir}: run scripts/setup_services.sh "
            "(apt-get download busybox-static)"
        )
    return found[-1]


def _busybox_binary(deb: Path) -> bytes:
    tar_stream = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar_stream)) as tar:
        member = tar.extractfile("./bin/busybox")
        if member is None:
            raise ServiceError(f"{deb} holds no ./bin/busybox")
        return member.read()


def _applets(busybox: bytes) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "busybox"
        exe.write_bytes(busybox)
        exe.chmod(0o755)
        listing = subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True)
    return sorted({a for a in listing.stdout.split() if a and "/" not in a and a != "busybox"})


def _rootfs_tar(
    busybox: bytes, applets: list[str], extra_files: Mapping[str, bytes] | None = None
) -> bytes:
    buf = io.BytesIO()
    now = int(time.time())

    def add(name: str, kind: bytes, mode: int, data: bytes = b"", target: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, now
        if kind == tarfile.SYMTYPE:
            info.linkname = target
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data) if data else None)

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "etc", "dev", "proc", "sys", "root", "input", "output", "home"):
            add(d, tarfile.DIRTYPE, 0o755)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        add("bin/busybox", tarfile.REGTYPE, 0o755, busybox)
        for applet in applets:
            add(f"bin/{applet}", tarfile.SYMTYPE, 0o777, target="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\n"
            b"nobody:x:65534:65534:nobody:/home:/bin/sh\n")  # fmt: skip
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnogroup:x:65534:\n")
        for name, data in sorted((extra_files or {}).items()):
            add(name.lstrip("/"), tarfile.REGTYPE, 0o644, data)
    return buf.getvalue()


def ensure_busybox_image(
    client: docker.DockerClient,
    tag: str = BUSYBOX_IMAGE,
    deb: Path | None = None,
    *,
    extra_files: Mapping[str, bytes] | None = None,
) -> str:
    """Make sure ``tag`` exists in the engine, building it from the busybox .deb if needed;
    ``extra_files`` (path in the image -> bytes) are added to the root file system.

    Returns the image id. Fast (one API call) when the image is already there.
    """
    deb = deb or busybox_deb()
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if extra_files:  # the label tells variants apart too
        extra = hashlib.sha256()
        for name, data in sorted(extra_files.items()):
            extra.update(f"{name}\0{len(data)}\0".encode() + data)
        digest = f"{digest}+{extra.hexdigest()}"
    try:
        image = client.images.get(tag)
        if (image.labels or {}).get(_LABEL) == digest:
            return str(image.id)
    except docker.errors.ImageNotFound:
        pass
    started = time.monotonic()
    busybox = _busybox_binary(deb)
    repository, _, version = tag.rpartition(":")
    client.api.import_image_from_data(
        _rootfs_tar(busybox, _applets(busybox), extra_files),
        repository=repository,
        tag=version,
        changes=[
            "ENV PATH=/bin",
            'CMD ["/bin/sh"]',
            "WORKDIR /",
            f"LABEL {_LABEL}={digest}",
        ],
    )
    image = client.images.get(tag)
    log.info("built %s (%s) in %.1f s", tag, image.short_id, time.monotonic() - started)
    return str(image.id)


def push_image(
    client: docker.DockerClient,
    registry: str,
    image: str = BUSYBOX_IMAGE,
    *,
    repository: str | None = None,
    tag: str | None = None,
    auth_config: Mapping[str, str] | None = None,
) -> str:
    """Push ``image`` (in the engine) to ``registry`` (``host:port``) as ``repository:tag``
    (default: the image's own name and tag) and return its pinned reference
    ``registry/repository@sha256:<hex>``, the digest as the registry computed it.

    The engine must reach the registry (dockerd pushes; loopback registries need no TLS)."""
    name, _, own_tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
    repository = repository or name
    tag = tag or own_tag or "latest"
    target = f"{registry}/{repository}"
    started = time.monotonic()
    if not client.images.get(image).tag(target, tag):
        raise ServiceError(f"docker tag {image} {target}:{tag} failed")
    digest = ""
    kwargs: dict[str, Any] = {"stream": True, "decode": True}
    if auth_config:
        kwargs["auth_config"] = dict(auth_config)
    for event in client.api.push(target, tag=tag, **kwargs):
        if "error" in event:
            detail = event.get("errorDetail", {}).get("message") or event["error"]
            raise ServiceError(f"docker push {target}:{tag} failed: {detail}")
        aux = event.get("aux") or {}
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = str(aux["Digest"])
    if not digest.startswith("sha256:"):
        raise ServiceError(f"docker push {target}:{tag} reported no digest")
    log.info("pushed %s as %s@%s in %.1f s", image, target, digest, time.monotonic() - started)
    return f"{target}@{digest}"


def publish_busybox(
    client: docker.DockerClient, registry: str, auth_config: Mapping[str, str] | None = None
) -> str:
    """Build (if needed) ``gridmarket/busybox:test`` and push it to ``registry``: the pinned
    reference ``registry/gridmarket/busybox@sha256:<hex>`` demo and e2e specs name."""
    ensure_busybox_image(client)
    return push_image(client, registry, BUSYBOX_IMAGE, auth_config=auth_config)


# --------------------------------------------------------------------------- python3 + numpy

PYTHON_IMAGE = "gridmarket/python-numpy:test"
PYTHON_SCRIPT_IN_IMAGE = "/opt/gridmarket/hours_regression.py"
_PY_LABEL = "org.gridmarket.python-debs-sha256"
_PY_DEB_DIR = _DEB_DIR / "python-numpy"
_PY_SCRIPT = ROOT / "examples" / "python" / "hours_regression.py"
_PY_LAYOUT = "1"  # bump when the root file system's layout below changes: rebuilds the image
# Not needed to run python3 and numpy: docs, man pages, numpy's test suites (~10 MiB in all).
_PY_SKIP = ("usr/share/doc/", "usr/share/man/", "usr/share/lintian/", "usr/share/bug/")
_PY_SKIP_PARTS = ("/numpy/", "/tests/")  # a path holding both is a numpy test file


def python_debs(deb_dir: Path = _PY_DEB_DIR) -> list[Path]:
    """The cached .debs of the python3 + numpy closure, as ``closure.txt`` lists them
    (scripts/setup_services.sh downloads them)."""
    manifest = deb_dir / "closure.txt"
    hint = "run scripts/setup_services.sh (apt-get download of python3-minimal python3-numpy)"
    if not manifest.is_file():
        raise ServiceError(f"no {manifest}: {hint}")
    debs = [deb_dir / name for name in manifest.read_text().split()]
    missing = [d.name for d in debs if not d.is_file()]
    if not debs or missing:
        raise ServiceError(f"{deb_dir} lacks {missing or 'every .deb'}: {hint}")
    return debs


ALTERNATIVES = ("blas/libblas.so.3", "lapack/liblapack.so.3")
"""The links update-alternatives (a maintainer script, never run here) would make."""


class RootfsTar:
    """A job image's root file system written as one tar from .deb members: the first copy of a
    path wins, hard links keep their archive targets, the BLAS/LAPACK alternatives' links are
    made, and :meth:`finish` adds the sandbox's skeleton (``/input``, ``/output``, ``/tmp``,
    ``nobody`` 65534). Counts regular files and their bytes. Shared by this module's python3 +
    numpy image and devstack/torch_image.py."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.seen: set[str] = set()
        self.files = self.size = 0
        self.now = int(time.time())

    def add(self, name: str, kind: bytes, mode: int, data: bytes = b"", target: str = "") -> None:
        """A made entry (directory, link or small file), unless ``name`` is already there."""
        if name in self.seen:
            return
        self.seen.add(name)
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime, info.size = kind, mode, self.now, len(data)
        info.linkname = target
        self.tar.addfile(info, io.BytesIO(data) if data else None)

    def member(self, pkg: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        """A .deb's ``member`` at ``name`` (its path without ``./``), then the alternatives'
        link it stands for, if any."""
        self.seen.add(name)
        member.name = name
        if member.islnk():  # hard links name their target by its archive path
            member.linkname = member.linkname.removeprefix("./")
        if member.isfile():
            self.tar.addfile(member, pkg.extractfile(member))
            self.files, self.size = self.files + 1, self.size + member.size
        else:
            self.tar.addfile(member)
        for lib in ALTERNATIVES:
            if name.endswith("/" + lib):
                self.add(name.removesuffix(lib) + lib.split("/")[1], tarfile.SYMTYPE, 0o777,
                         target=lib)  # fmt: skip

    def finish(self, dirs: tuple[str, ...] = ()) -> None:
        """The sandbox's skeleton, with ``dirs`` (e.g. ``checkpoint``) besides the usual ones."""
        for d in ("input", "output", *dirs, "home", "root", "opt", "opt/gridmarket"):
            self.add(d, tarfile.DIRTYPE, 0o755)
        self.add("tmp", tarfile.DIRTYPE, 0o1777)
        self.add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\n"
                 b"nobody:x:65534:65534:nobody:/home:/bin/sh\n")  # fmt: skip
        self.add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnogroup:x:65534:\n")


def _python_rootfs(debs: list[Path], script: bytes, out: Path) -> tuple[int, int]:
    """Write the image's root file system to the tar ``out``; returns (files, bytes of data)."""
    with tarfile.open(out, mode="w") as tar:
        root = RootfsTar(tar)
        for deb in debs:
            data = subprocess.run(
                ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(data)) as pkg:
                for member in pkg:
                    name = member.name.removeprefix("./").rstrip("/")
                    if (
                        not name
                        or name in root.seen
                        or name.startswith(_PY_SKIP)
                        or all(part in f"/{name}/" for part in _PY_SKIP_PARTS)
                    ):
                        continue
                    root.member(pkg, member, name)
        root.finish()
        root.add(PYTHON_SCRIPT_IN_IMAGE.lstrip("/"), tarfile.REGTYPE, 0o755, script)
    return root.files, root.size


def ensure_python_image(
    client: docker.DockerClient,
    tag: str = PYTHON_IMAGE,
    debs: list[Path] | None = None,
    *,
    script: Path = _PY_SCRIPT,
) -> str:
    """Make sure ``tag`` (python3 + numpy, ``script`` at :data:`PYTHON_SCRIPT_IN_IMAGE`) exists
    in the engine, building it from the cached .debs when they or the script changed.

    Returns the image id. Fast (hashing ~23 MB of .debs, one API call) when it is already there.
    """
    debs = debs if debs is not None else python_debs()
    code = script.read_bytes()
    h = hashlib.sha256(f"layout {_PY_LAYOUT}\0".encode())
    for deb in sorted(debs):
        h.update(f"{deb.name}\0".encode() + hashlib.sha256(deb.read_bytes()).digest())
    h.update(b"script\0" + code)
    digest = h.hexdigest()
    try:
        image = client.images.get(tag)
        if (image.labels or {}).get(_PY_LABEL) == digest:
            return str(image.id)
    except docker.errors.ImageNotFound:
        pass
    started = time.monotonic()
    repository, _, version = tag.rpartition(":")
    with tempfile.TemporaryDirectory(prefix="gridmarket-python-image-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        files, size = _python_rootfs(sorted(debs), code, rootfs)
        client.api.import_image_from_file(
            str(rootfs),
            repository=repository,
            tag=version,
            changes=[
                "ENV PATH=/usr/local/bin:/usr/bin:/bin",
                "ENV LANG=C.UTF-8",
                "ENV PYTHONDONTWRITEBYTECODE=1",
                f'CMD ["python3", "{PYTHON_SCRIPT_IN_IMAGE}"]',
                "WORKDIR /",
                f"LABEL {_PY_LABEL}={digest}",
            ],
        )
    image = client.images.get(tag)
    log.info(
        "built %s (%s; %d files, %.1f MiB) in %.1f s",
        tag, image.short_id, files, size / 2**20, time.monotonic() - started,
    )  # fmt: skip
    return str(image.id)


def publish_python_image(
    client: docker.DockerClient, registry: str, auth_config: Mapping[str, str] | None = None
) -> str:
    """Build (if needed) ``gridmarket/python-numpy:test`` and push it to ``registry``: the pinned
    reference ``registry/gridmarket/python-numpy@sha256:<hex>``."""
    ensure_python_image(client)
    return push_image(client, registry, PYTHON_IMAGE, auth_config=auth_config)
