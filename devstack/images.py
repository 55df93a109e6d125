"""Build the local test image ``gridmarket/busybox:test``, and push images to a local registry.

The root file system is Debian's static busybox (``busybox-static``, the .deb that
scripts/setup_services.sh caches under ``.cache/debs/``) with a symlink per applet, plus
``/etc/passwd`` (root and ``nobody`` 65534), ``/tmp``, ``/input`` and ``/output``. It is
imported with ``docker import`` semantics (``POST /images/create?fromSrc=-``); a label records the
.deb's SHA-256 so a different busybox rebuilds the image and an unchanged one is reused.

:func:`push_image` pushes an image of the engine to a registry (devstack/registry.py) and returns
the reference jobs carry, ``127.0.0.1:<port>/gridmarket/busybox@sha256:<hex>``;
:func:`ensure_busybox_image` with ``extra_files`` builds a variant (its own layer, its own digest).
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

__all__ = ["BUSYBOX_IMAGE", "busybox_deb", "ensure_busybox_image", "publish_busybox", "push_image"]

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
