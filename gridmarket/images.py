"""Container image references and the registry HTTP API v2: parse, resolve a tag, size a manifest.

A job names its image by digest, ``host[:port]/name@sha256:<64 hex>`` (:func:`parse_pinned`): the
bytes the node runs are then fixed by the spec. The CLI and the submit page turn a tag into that
form before funding (:meth:`RegistryClient.resolve`: ``HEAD /v2/<name>/manifests/<tag>`` with the
OCI and Docker v2 ``Accept`` types, answered by ``Docker-Content-Digest``); the agent sizes an
image before it pulls it (:meth:`RegistryClient.download_size`: the manifest's config and layer
sizes, the manifest's bytes checked against the digest first).

Registries on a loopback address are spoken to over plain HTTP (as dockerd does for 127.0.0.0/8),
every other one over HTTPS. A registry that wants credentials gets them from ``credentials``
(keyed by ``host[:port]``): HTTP basic, or the bearer-token flow (``WWW-Authenticate: Bearer
realm=...``, the token fetched from the realm with the same user and password), or a fixed token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

__all__ = [
    "ACCEPT_MANIFESTS",
    "Credentials",
    "ImageRef",
    "ImageRefError",
    "ManifestInfo",
    "RegistryClient",
    "RegistryError",
    "RegistryUnavailableError",
    "RegistryUnreachableError",
    "load_docker_credentials",
    "parse_image_ref",
    "parse_pinned",
    "resolve_image",
]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT_MANIFESTS = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
"""The ``Accept`` header of manifest requests: OCI and Docker v2 images and indexes (lists)."""
_INDEXES = (OCI_INDEX, DOCKER_LIST)
_IMAGES = (OCI_MANIFEST, DOCKER_MANIFEST)

MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # what distribution itself accepts for a manifest

# The grammar of github.com/distribution/reference, less the rarely used corners.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_REF = re.compile(
    rf"^(?:(?P<host>{_DOMAIN})/)?(?P<name>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>[a-z0-9]+:[a-zA-Z0-9=_-]+))?$"
)
_NAME = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_REF = 512


class ImageRefError(ValueError):
    """An image reference that does not parse, or is not in the form asked for."""


class RegistryError(RuntimeError):
    """The registry refused (unknown name or digest, denied) or answered with something invalid;
    ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RegistryUnavailableError(RegistryError, OSError):
    """The registry could not be reached, timed out, or failed (5xx)."""


class RegistryUnreachableError(RegistryUnavailableError):
    """No connection to the registry at all: its name does not resolve, nothing listens there,
    the connection or the TLS handshake failed (a read that timed out is not this)."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """``[host[:port]/]name[:tag][@sha256:...]``; ``host`` is None for Docker Hub short names."""

    host: str | None
    name: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        out = f"{self.host}/{self.name}" if self.host else self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    @property
    def repository(self) -> str:
        """``host/name`` (what ``docker pull`` takes before ``:tag`` / ``@digest``)."""
        return f"{self.host}/{self.name}" if self.host else self.name

    @property
    def pinned(self) -> bool:
        """True when the reference names a registry and a sha256 digest (a job may use it)."""
        return self.host is not None and self.digest is not None

    def pin(self, digest: str) -> ImageRef:
        """The same repository at ``digest``, without the tag (the form specs carry)."""
        if not _SHA256.match(digest):
            raise ImageRefError(f"not a sha256 digest: {digest!r}")
        return replace(self, tag=None, digest=digest)


def parse_image_ref(ref: str) -> ImageRef:
    """Parse any image reference; a first component with a dot, a colon, or ``localhost`` is the
    registry host (Docker's rule). Only sha256 digests are accepted."""
    if not isinstance(ref, str) or not ref or len(ref) > _MAX_REF:
        raise ImageRefError(f"not an image reference: {ref!r}")
    match = _REF.match(ref)
    if match is None:
        raise ImageRefError(
            f"not an image reference: {ref!r} (expected host[:port]/name[:tag][@sha256:<hex>], "
            "lower-case name)"
        )
    host, name, tag, digest = match.group("host", "name", "tag", "digest")
    if host is not None and not ("." in host or ":" in host or host == "localhost"):
        name, host = f"{host}/{name}", None  # "library/busybox": a path, not a host
        if not _NAME.match(name):
            raise ImageRefError(f"not an image reference: {ref!r} (names are lower-case)")
    if digest is not None and not _SHA256.match(digest):
        raise ImageRefError(f"{ref!r}: the digest must be sha256:<64 lower-case hex digits>")
    return ImageRef(host=host, name=name, tag=tag, digest=digest)


def parse_pinned(ref: str) -> ImageRef:
    """Parse a reference a job may carry: ``host[:port]/name@sha256:<64 hex>`` and nothing else
    (a tag next to the digest is refused too: it would only be misread)."""
    image = parse_image_ref(ref)
    if image.host is None:
        raise ImageRefError(f"{ref!r} names no registry: write host[:port]/name@sha256:<hex>")
    if image.digest is None:
        raise ImageRefError(
            f"{ref!r} is not pinned to a digest: resolve the tag first "
            "(host[:port]/name@sha256:<hex>)"
        )
    if image.tag is not None:
        raise ImageRefError(f"{ref!r}: give the digest alone, without the tag")
    return image


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user and password (basic auth, or for the bearer-token flow), or a fixed bearer token."""

    username: str = ""
    password: str = ""
    token: str = ""

    def __repr__(self) -> str:  # never print secrets
        return f"Credentials(username={self.username!r}, password=***, token=***)"

    def docker_auth(self) -> dict[str, str]:
        """The ``auth_config`` the Docker SDK takes for a pull or a push."""
        if self.token:
            return {"registrytoken": self.token}
        return {"username": self.username, "password": self.password}


def load_docker_credentials(path: str | Path) -> dict[str, Credentials]:
    """Registry credentials from a Docker ``config.json`` (``{"auths": {"host[:port]": {"auth":
    base64("user:password")}}}``; ``username``/``password`` or ``registrytoken`` also read).
    Credential helpers (``credsStore``) are not run. Keys lose a leading ``https://``/``http://``
    and a trailing ``/...``."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read registry credentials from {path}: {exc}") from exc
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise ValueError(f'{path}: no "auths" object')
    found: dict[str, Credentials] = {}
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            continue
        host = str(key).split("://", 1)[-1].split("/", 1)[0]
        if entry.get("registrytoken"):
            found[host] = Credentials(token=str(entry["registrytoken"]))
        elif entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError, TypeError) as exc:
                raise ValueError(f"{path}: bad auth for {key}") from exc
            if not sep:
                raise ValueError(f"{path}: bad auth for {key} (no user:password)")
            found[host] = Credentials(user, password)
        elif entry.get("username"):
            found[host] = Credentials(str(entry["username"]), str(entry.get("password", "")))
    return found


@dataclass(frozen=True, slots=True)
class ManifestInfo:
    """One image manifest (an index resolved to this machine's platform)."""

    digest: str  # of the manifest asked for (the index's, when it was an index)
    media_type: str
    config_bytes: int
    layer_bytes: tuple[int, ...]

    @property
    def download_bytes(self) -> int:
        """What a pull downloads at most (compressed layers and the config)."""
        return self.config_bytes + sum(self.layer_bytes)


def is_loopback_host(host: str) -> bool:
    hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]")[0]
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)
    return "linux", arch


class RegistryClient:
    """Speaks the registry HTTP API v2 (only reads: manifests)."""

    def __init__(
        self,
        credentials: Mapping[str, Credentials] | None = None,
        *,
        timeout: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        self.credentials = dict(credentials or {})
        self.timeout = timeout
        self._session = session or requests.Session()
        self._tokens: dict[tuple[str, str], str] = {}  # (host, scope) -> bearer token

    def close(self) -> None:
        self._session.close()

    # ------------------------------------------------------------------ public

    def resolve(self, ref: str | ImageRef) -> ImageRef:
        """The pinned form of ``ref``: its tag (``latest`` when none) resolved to the digest the
        registry holds now. A reference that already has a digest is checked to exist."""
        image = parse_image_ref(ref) if isinstance(ref, str) else ref
        if image.host is None:
            raise ImageRefError(f"{image} names no registry: write host[:port]/name[:tag]")
        if image.digest is not None:
            self.manifest(image)  # raises when it is not there (or its bytes do not match)
            return image.pin(image.digest)
        tag = image.tag or "latest"
        response = self._request("HEAD", image, f"manifests/{tag}")
        digest = response.headers.get("Docker-Content-Digest", "")
        if not _SHA256.match(digest):  # a registry that does not say: hash the manifest
            response = self._request("GET", image, f"manifests/{tag}")
            digest = "sha256:" + hashlib.sha256(_body(response)).hexdigest()
        return image.pin(digest)

    def manifest(self, ref: str | ImageRef) -> ManifestInfo:
        """The manifest ``ref`` names (pinned: its bytes must hash to the digest), an index
        resolved to this machine's platform (linux/amd64 on x86-64)."""
        image = parse_image_ref(ref) if isinstance(ref, str) else ref
        if image.host is None:
            raise ImageRefError(f"{image} names no registry")
        wanted = image.digest or image.tag or "latest"
        media_type, doc, digest = self._manifest(image, wanted)
        if media_type in _INDEXES or "manifests" in doc:
            child = _pick_platform(doc, image)
            media_type, doc, _ = self._manifest(image, child)
        if media_type not in _IMAGES and "layers" not in doc:
            raise RegistryError(f"{image}: unsupported manifest type {media_type!r}")
        try:
            config = int(doc["config"]["size"])
            layers = tuple(int(layer["size"]) for layer in doc["layers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"{image}: malformed manifest ({exc})") from exc
        if config < 0 or any(size < 0 for size in layers):
            raise RegistryError(f"{image}: negative sizes in the manifest")
        return ManifestInfo(digest, media_type, config, layers)

    def download_size(self, ref: str | ImageRef) -> int:
        """Bytes a pull of ``ref`` downloads at most (config and compressed layers)."""
        return self.manifest(ref).download_bytes

    # ------------------------------------------------------------------ steps

    def _manifest(self, image: ImageRef, reference: str) -> tuple[str, dict[str, Any], str]:
        response = self._request("GET", image, f"manifests/{reference}")
        body = _body(response)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"{image.repository}: the registry answered {reference} with a manifest whose "
                f"digest is {digest}: refused"
            )
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise RegistryError(f"{image.repository}@{reference}: manifest is not JSON") from exc
        if not isinstance(doc, dict):
            raise RegistryError(f"{image.repository}@{reference}: manifest is not a JSON object")
        media_type = str(doc.get("mediaType") or response.headers.get("Content-Type", ""))
        media_type = media_type.split(";")[0].strip()
        return media_type, doc, digest

    def _base(self, host: str) -> str:
        scheme = "http" if is_loopback_host(host) else "https"
        return f"{scheme}://{host}/v2/"

    def _request(self, method: str, image: ImageRef, path: str) -> requests.Response:
        assert image.host is not None
        url = f"{self._base(image.host)}{image.name}/{path}"
        scope = f"repository:{image.name}:pull"
        headers = {"Accept": ACCEPT_MANIFESTS}
        token = self._tokens.get((image.host, scope))
        creds = self.credentials.get(image.host)
        for attempt in range(2):
            auth: tuple[str, str] | None = None
            if token:
                headers["Authorization"] = f"Bearer {token}"
            elif creds is not None and creds.token:
                headers["Authorization"] = f"Bearer {creds.token}"
            elif creds is not None and attempt > 0:
                auth = (creds.username, creds.password)
            try:
                response = self._session.request(
                    method,
                    url,
                    headers=headers,
                    auth=auth,
                    timeout=self.timeout,
                    stream=True,
                    allow_redirects=method == "GET",
                )
            except requests.ConnectionError as exc:
                raise RegistryUnreachableError(f"registry {image.host} unreachable: {exc}") from exc
            except requests.RequestException as exc:
                raise RegistryUnavailableError(f"registry {image.host} failed: {exc}") from exc
            if response.status_code != 401 or attempt > 0:
                break
            challenge = response.headers.get("WWW-Authenticate", "")
            response.close()
            if challenge.lower().startswith("bearer"):
                token = self._bearer_token(image.host, challenge, scope, creds)
                self._tokens[(image.host, scope)] = token
            elif creds is None:
                break
        return _check(response, image, path)

    def _bearer_token(
        self, host: str, challenge: str, scope: str, creds: Credentials | None
    ) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(f"registry {host}: bearer challenge without a realm: {challenge}")
        params.setdefault("scope", scope)
        auth = (creds.username, creds.password) if creds and creds.username else None
        try:
            response = self._session.get(realm, params=params, auth=auth, timeout=self.timeout)
        except requests.ConnectionError as exc:
            raise RegistryUnreachableError(f"token server {realm} unreachable: {exc}") from exc
        except requests.RequestException as exc:
            raise RegistryUnavailableError(f"token server {realm} failed: {exc}") from exc
        if response.status_code != 200:
            raise RegistryError(
                f"registry {host}: the token server refused ({response.status_code})",
                response.status_code,
            )
        try:
            doc = response.json()
            return str(doc.get("token") or doc["access_token"])
        except (ValueError, KeyError, AttributeError) as exc:
            raise RegistryError(f"registry {host}: the token server answered no token") from exc


def resolve_image(
    ref: str, credentials: Mapping[str, Credentials] | None = None, *, timeout: float = 10.0
) -> str:
    """``host[:port]/name@sha256:<hex>`` for ``ref`` (a tag resolved through the registry now, a
    digest checked to be there): what the CLI and the submit page put in a spec before funding.
    Raises ImageRefError, RegistryError (RegistryUnavailableError when unreachable)."""
    client = RegistryClient(credentials, timeout=timeout)
    try:
        return str(client.resolve(ref))
    finally:
        client.close()


def _check(response: requests.Response, image: ImageRef, path: str) -> requests.Response:
    status = response.status_code
    if status < 300:
        return response
    what = f"{image.repository} ({path})"
    response.close()
    if status == 401:
        raise RegistryError(f"registry {image.host} wants credentials for {what}", status)
    if status == 403:
        raise RegistryError(f"registry {image.host} denies access to {what}", status)
    if status == 404:
        raise RegistryError(f"{what}: not in registry {image.host}", status)
    if status == 429 or status >= 500:
        raise RegistryUnavailableError(f"registry {image.host} failed ({status}) on {what}", status)
    raise RegistryError(f"registry {image.host} answered {status} on {what}", status)


def _body(response: requests.Response) -> bytes:
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_MANIFEST_BYTES:
        response.close()
        raise RegistryError(f"manifest of {declared} bytes: over {MAX_MANIFEST_BYTES}")
    chunks: list[bytes] = []
    total = 0
    try:
        for chunk in response.iter_content(65536):
            total += len(chunk)
            if total > MAX_MANIFEST_BYTES:
                raise RegistryError(f"manifest over {MAX_MANIFEST_BYTES} bytes")
            chunks.append(chunk)
    except requests.RequestException as exc:
        raise RegistryUnavailableError(f"manifest download failed: {exc}") from exc
    finally:
        response.close()
    return b"".join(chunks)


def _pick_platform(index: dict[str, Any], image: ImageRef) -> str:
    want_os, want_arch = _platform()
    for entry in index.get("manifests") or []:
        if not isinstance(entry, dict):
            continue
        plat = entry.get("platform") or {}
        if not isinstance(plat, dict):
            continue
        if plat.get("os") == want_os and plat.get("architecture") == want_arch:
            digest = entry.get("digest", "")
            if isinstance(digest, str) and _SHA256.match(digest):
                return digest
    raise RegistryError(f"{image}: the index has no {want_os}/{want_arch} image")
