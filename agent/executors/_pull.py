"""Pull job images by digest, within a size cap and a time limit, and keep a cache with a budget.

(Length: 508 lines, one concept: a pull and its faults; the registry policy and its guarded
session already live in gridmarket/. Split the cache out if it grows.)

Only a pinned reference, ``host[:port]/name@sha256:<hex>`` (:func:`gridmarket.images.parse_pinned`),
is ever pulled. Before the pull the manifest is fetched from the registry (its bytes must hash to
the digest) and its config and layer sizes are added up: over ``max_download_bytes`` and nothing
is pulled. The pull itself (dockerd's ``POST /images/create``) is read in a thread; at the time
limit, on cancel, or when the progress dockerd reports passes the cap, the connection to dockerd
is shut down, which makes dockerd abort the pull. Afterwards the image must carry the requested
digest in its ``RepoDigests`` and be no larger, unpacked, than ``max_image_bytes``.

Images this agent pulled are remembered (in memory, and in ``state_file`` when given, so a
restarted agent still knows them) with when each was last used. After a pull, while they add up
to more than ``cache_bytes``, the least recently used one is removed from the engine, by its digest
reference and without force: an image the operator also tagged keeps its tag, one a container uses
(or a run of this agent is about to use) is skipped, and images the agent did not pull are never
touched.

Only registries the provider allows are spoken to (``PullPolicy.registries``, the agent's
``pull_registries``: public registries by default, and the ones it lists; see
:mod:`gridmarket.registry_policy`). The registry's name is resolved and every address checked
before anything is sent; the manifest check connects only to an address it checked (redirects
and token servers included). dockerd resolves the name again for its own pull.

Whose fault a refusal is (the scheduler's ``fault_of``): a reference that is not pinned, a
registry on a forbidden address (loopback, private, link-local, metadata, ...) or whose name does
not resolve, one that cannot be reached (refused, connection or TLS failure), a digest the
registry does not have, a registry that serves other bytes than the digest, are the job's
(:class:`ImagePullError`, a :class:`~agent.errors.ImageNotFoundError`: ``workload_error``, the
job fails at once); an image over this node's cap, a public registry this node's list leaves out,
or one this node has no credentials for, is refused with "this node does not run ..."
(``workload_error``, counted as the node's: the job goes to another node); a registry that fails
(5xx) or is too slow, a pull past the time limit, a name this node cannot resolve just now, are
the node's (:class:`ImagePullUnavailableError`, an :class:`~agent.errors.ExecutorError`:
``agent_error``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.auth
import docker.errors
import requests
import requests.exceptions

from agent.errors import ExecutorError, ImageNotFoundError
from gridmarket.images import (
    Credentials,
    ImageRef,
    ImageRefError,
    RegistryClient,
    RegistryError,
    RegistryUnavailableError,
    RegistryUnreachableError,
    parse_image_ref,
    parse_pinned,
)
from gridmarket.registry_policy import RegistryPolicy, RegistryRefusedError
from gridmarket.registry_session import guarded_session

log = logging.getLogger(__name__)

GiB = 1024**3
NODE_REFUSES = "this node does not run"  # the scheduler's marker of a node-side workload error
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class ImagePullError(ImageNotFoundError):
    """The job's image cannot be had for a reason of the spec's (not pinned, a forbidden,
    unknown or unreachable registry, an unknown digest, other bytes served), or of this node's
    policy (the message then starts with "this node does not run")."""


class ImagePullUnavailableError(ExecutorError):
    """The registry failed (5xx) or was too slow, or the pull ran past the time limit."""


@dataclass(frozen=True, slots=True)
class PullPolicy:
    """What an agent agrees to pull (``enabled=False``: images must already be in the engine)."""

    enabled: bool = True
    max_download_bytes: int = 4 * GiB  # compressed layers and config, from the manifest
    max_image_bytes: int = 16 * GiB  # unpacked, checked after the pull
    timeout_s: float = 600.0  # manifest check and pull together
    cache_bytes: int = 50 * GiB  # pulled images kept, by unpacked size; LRU beyond
    credentials: Mapping[str, Credentials] = field(default_factory=dict)  # by host[:port]
    state_file: Path | None = None  # remembers which images this agent pulled, across restarts
    registries: RegistryPolicy = field(  # the registries spoken to (public ones by default)
        default_factory=lambda: RegistryPolicy(setting="pull_registries")
    )

    def __post_init__(self) -> None:
        if min(self.max_download_bytes, self.max_image_bytes, self.cache_bytes) <= 0:
            raise ValueError("pull caps and the cache budget must be positive")
        if self.timeout_s <= 0:
            raise ValueError("the pull time limit must be positive")


@dataclass(slots=True)
class _Entry:
    size: int
    last_used: float
    pulled_at: float


class ImagePuller:
    """Makes a job's image present (pulling it when allowed) and keeps the pulled-image cache."""

    def __init__(self, client: docker.DockerClient, policy: PullPolicy | None = None) -> None:
        self.client = client
        self.policy = policy or PullPolicy()
        self._lock = threading.Lock()
        self._pulling: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self._cache: dict[str, _Entry] = self._load()

    # ------------------------------------------------------------------ public

    def acquire(self, image: str, cancel: threading.Event | None = None) -> str:
        """Make ``image`` present and mark it in use (never evicted) until :meth:`release`;
        returns the image id. Raises :class:`ImagePullError` / :class:`ImagePullUnavailableError`
        / ImageNotFoundError / ExecutorError."""
        key = image
        with self._lock:
            self._in_use[key] = self._in_use.get(key, 0) + 1
        try:
            image_id = self._present(image)
            if image_id is None:
                image_id = self._pull_once(image, cancel)
            else:
                self._touch(image)
            return image_id
        except BaseException:
            self.release(image)
            raise

    def release(self, image: str) -> None:
        with self._lock:
            left = self._in_use.get(image, 0) - 1
            if left > 0:
                self._in_use[image] = left
            else:
                self._in_use.pop(image, None)

    def pulled_images(self) -> dict[str, int]:
        """The images this agent pulled and still has: digest reference -> unpacked bytes."""
        with self._lock:
            return {ref: entry.size for ref, entry in self._cache.items()}

    def cached_images(self) -> list[str]:
        """Every image in the engine by digest reference (``host/name@sha256:...``): what this
        node can run without pulling (the capacity advert). Sorted; tag-only images are left out
        (a job cannot name them)."""
        refs: set[str] = set()
        try:
            for image in self.client.images.list():
                for ref in image.attrs.get("RepoDigests") or []:
                    with contextlib.suppress(ImageRefError):
                        if parse_pinned(ref):
                            refs.add(ref)
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise ExecutorError(f"the Docker engine did not answer: {exc}") from exc
        return sorted(refs)

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used pulled images until they fit ``cache_bytes`` (never one in
        use, never ``keep``); returns the references removed."""
        removed: list[str] = []
        with self._lock:
            self._forget_missing()
            candidates = sorted(self._cache.items(), key=lambda item: item[1].last_used)
            total = sum(entry.size for entry in self._cache.values())
        for ref, entry in candidates:
            if total <= self.policy.cache_bytes:
                break
            # Under the lock: a run cannot mark it in use between the check and the removal.
            with self._lock:
                if ref == keep or ref in self._in_use or self._has_containers(ref):
                    continue
                try:
                    self.client.images.remove(ref, noprune=False)
                except docker.errors.ImageNotFound:
                    pass
                except docker.errors.APIError as exc:  # 409: a container still uses it
                    log.warning("cannot evict %s: %s", ref, exc)
                    continue
                self._cache.pop(ref, None)
            total -= entry.size
            removed.append(ref)
            log.info("evicted %s (%d bytes, last used %.0f s ago)", ref, entry.size,
                     time.time() - entry.last_used)  # fmt: skip
        if removed:
            self._save()
        return removed

    # ------------------------------------------------------------------ steps

    def _present(self, image: str) -> str | None:
        try:
            return str(self.client.images.get(image).id)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise ExecutorError(f"the Docker engine did not answer: {exc}") from exc

    def _pull_once(self, image: str, cancel: threading.Event | None) -> str:
        try:
            ref = parse_image_ref(image)
        except ImageRefError as exc:
            message = f"image {image!r} is not on this node (never pulled): {exc}"
            raise ImagePullError(message) from None
        if not self.policy.enabled:
            raise ImageNotFoundError(
                f"image {image!r} is not on this node and images are never pulled here: "
                "load it first (docker load / docker pull)"
            )
        if not ref.pinned or ref.tag is not None:
            raise ImagePullError(
                f"image {image!r} is not on this node, and images not named by digest are never "
                "pulled: name it host[:port]/name@sha256:<hex> (resolve the tag before submitting)"
            )
        with self._lock:
            gate = self._pulling.setdefault(image, threading.Lock())
        with gate:  # one pull per image at a time; the second caller finds it present
            image_id = self._present(image)
            if image_id is not None:
                self._touch(image)
                return image_id
            return self._pull(ref, cancel)

    def _pull(self, ref: ImageRef, cancel: threading.Event | None) -> str:
        policy = self.policy
        assert ref.host is not None and ref.digest is not None
        started = time.monotonic()
        deadline = started + policy.timeout_s
        creds = policy.credentials.get(ref.host)
        self._check_registry(ref)
        declared = self._declared_size(ref, creds, deadline)
        if declared > policy.max_download_bytes:
            raise ImagePullError(
                f"{NODE_REFUSES} images over {policy.max_download_bytes} bytes to download: "
                f"{ref} is {declared} bytes"
            )
        cap = min(policy.max_download_bytes, declared + 64 * 1024)
        _PullStream(self.client, ref, creds, cap).run(deadline, cancel, policy.timeout_s)
        image = self._pulled(ref)
        size = int(image.attrs.get("Size") or 0)
        if size > policy.max_image_bytes:
            with contextlib.suppress(docker.errors.APIError):
                self.client.images.remove(str(ref), noprune=False)
            raise ImagePullError(
                f"{NODE_REFUSES} images over {policy.max_image_bytes} bytes unpacked: "
                f"{ref} is {size} bytes (removed)"
            )
        now = time.time()
        with self._lock:
            self._cache[str(ref)] = _Entry(size=size, last_used=now, pulled_at=now)
        self._save()
        log.info("pulled %s (%d bytes down, %d unpacked) in %.1f s", ref, declared, size,
                 time.monotonic() - started)  # fmt: skip
        self.evict(keep=str(ref))
        return str(image.id)

    def _check_registry(self, ref: ImageRef) -> None:
        """Refuse a registry the policy does not allow, by its name and its addresses."""
        assert ref.host is not None
        try:
            self.policy.registries.addresses(ref.host)
        except RegistryRefusedError as exc:
            if exc.by_list:
                raise ImagePullError(f"{NODE_REFUSES} images from {ref.host}: {exc.why}") from None
            raise ImagePullError(f"cannot pull {ref}: {exc}") from None
        except OSError as exc:  # socket.gaierror
            if exc.errno in _NO_SUCH_NAME:
                raise ImagePullError(
                    f"cannot pull {ref}: registry {ref.host} does not resolve ({exc.strerror})"
                ) from None
            raise ImagePullUnavailableError(
                f"cannot pull {ref}: this node cannot resolve {ref.host} now ({exc})"
            ) from exc

    def _declared_size(self, ref: ImageRef, creds: Credentials | None, deadline: float) -> int:
        assert ref.host is not None
        timeout = max(1.0, min(30.0, deadline - time.monotonic()))
        registry = RegistryClient(
            {ref.host: creds} if creds else None,
            timeout=timeout,
            session=guarded_session(self.policy.registries),
        )
        try:
            return registry.download_size(ref)
        except RegistryRefusedError as exc:  # a redirect or a token server somewhere forbidden
            raise ImagePullError(f"cannot pull {ref}: {exc}") from None
        except RegistryUnreachableError as exc:
            raise ImagePullError(f"cannot pull {ref}: {exc}") from None
        except RegistryUnavailableError as exc:
            raise ImagePullUnavailableError(f"cannot pull {ref}: {exc}") from exc
        except RegistryError as exc:
            if exc.status in (401, 403):
                if creds is None:
                    raise ImagePullError(
                        f"{NODE_REFUSES} images from {ref.host}: it wants credentials and this "
                        f"node has none for it ({exc})"
                    ) from exc
                raise ImagePullUnavailableError(
                    f"registry {ref.host} refused this node's credentials: {exc}"
                ) from exc
            raise ImagePullError(f"cannot pull {ref}: {exc}") from exc
        except ImageRefError as exc:
            raise ImagePullError(f"cannot pull {ref}: {exc}") from exc
        finally:
            registry.close()

    def _pulled(self, ref: ImageRef) -> Any:
        try:
            image = self.client.images.get(str(ref))
        except docker.errors.ImageNotFound:
            raise ImagePullError(f"dockerd pulled {ref} but has no image by that digest") from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise ExecutorError(f"the Docker engine did not answer: {exc}") from exc
        if str(ref) not in (image.attrs.get("RepoDigests") or []):
            raise ImagePullError(f"the pulled image does not carry the digest {ref.digest}")
        return image

    def _has_containers(self, ref: str) -> bool:
        try:
            image_id = self.client.images.get(ref).id
            return bool(self.client.containers.list(all=True, filters={"ancestor": image_id}))
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return True  # in doubt, keep it

    def _touch(self, image: str) -> None:
        with self._lock:
            entry = self._cache.get(image)
            if entry is None:
                return
            entry.last_used = time.time()
        self._save()

    def _forget_missing(self) -> None:
        """Drop entries whose image is gone (removed by hand); call with the lock held."""
        for ref in list(self._cache):
            try:
                self.client.images.get(ref)
            except docker.errors.ImageNotFound:
                del self._cache[ref]
            except (docker.errors.APIError, requests.exceptions.RequestException):
                return

    def _load(self) -> dict[str, _Entry]:
        path = self.policy.state_file
        if path is None or not path.is_file():
            return {}
        try:
            doc = json.loads(path.read_text())
            return {
                str(ref): _Entry(int(e["size"]), float(e["last_used"]), float(e["pulled_at"]))
                for ref, e in doc.get("pulled", {}).items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the pulled-image state %s: %s", path, exc)
            return {}

    def _save(self) -> None:
        path = self.policy.state_file
        if path is None:
            return
        with self._lock:
            doc = {
                "pulled": {
                    ref: {"size": e.size, "last_used": e.last_used, "pulled_at": e.pulled_at}
                    for ref, e in self._cache.items()
                }
            }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "w") as out:
                json.dump(doc, out, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot save the pulled-image state %s: %s", path, exc)


class _PullStream:
    """One ``POST /images/create?fromImage=<repo>&tag=<digest>``, read in a thread; shutting
    its connection down makes dockerd abort the pull."""

    def __init__(
        self, client: docker.DockerClient, ref: ImageRef, creds: Credentials | None, cap: int
    ) -> None:
        self.api = client.api
        self.ref = ref
        self.creds = creds
        self.cap = cap
        self.error: str | None = None
        self.over_cap = 0
        self._progress: dict[str, int] = {}
        self._done = threading.Event()
        self._sock: Any = None
        self._response: requests.Response | None = None

    def run(self, deadline: float, cancel: threading.Event | None, limit_s: float) -> None:
        headers: dict[str, Any] = {}
        if self.creds is not None:
            headers["X-Registry-Auth"] = docker.auth.encode_header(self.creds.docker_auth())
        params = {"fromImage": self.ref.repository, "tag": self.ref.digest}
        try:
            response = self.api._post(
                self.api._url("/images/create"),
                params=params,
                headers=headers,
                stream=True,
                timeout=max(1.0, deadline - time.monotonic()),  # connect and first answer
            )
            self.api._raise_for_status(response)
        except docker.errors.APIError as exc:
            raise _engine_refusal(self.ref, str(exc.explanation or exc)) from exc
        except requests.exceptions.RequestException as exc:
            raise ImagePullUnavailableError(f"pull of {self.ref} failed: {exc}") from exc
        self._response = response
        self._sock = self.api._get_raw_response_socket(response)
        self.api._disable_socket_timeout(self._sock)  # from here on, the deadline rules
        reader = threading.Thread(target=self._read, name=f"pull-{self.ref.digest}", daemon=True)
        reader.start()
        stopped = ""
        while not self._done.wait(0.2):
            if cancel is not None and cancel.is_set():
                stopped = "cancelled by the agent"
            elif time.monotonic() > deadline:
                stopped = f"past the pull time limit of {limit_s:g} s"
            elif self.over_cap:
                stopped = f"{self.over_cap} bytes downloaded, over the cap of {self.cap}"
            if stopped:
                self._abort()
                break
        reader.join(timeout=10)
        response.close()
        if stopped:
            if self.over_cap:
                raise ImagePullError(f"pull of {self.ref} aborted: {stopped}")
            raise ImagePullUnavailableError(f"pull of {self.ref} aborted: {stopped}")
        if self.error is not None:
            raise _engine_refusal(self.ref, self.error)

    def _read(self) -> None:
        assert self._response is not None
        try:
            for line in self._response.iter_lines():
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    detail = (event.get("errorDetail") or {}).get("message") or event["error"]
                    self.error = str(detail)
                self._count(event)
        except Exception as exc:  # the socket shut down by _abort, or dockerd went away
            if self.error is None:
                self.error = f"the pull stream broke: {exc}"
        finally:
            self._done.set()

    def _count(self, event: dict[str, Any]) -> None:
        if event.get("status") != "Downloading":
            return
        detail = event.get("progressDetail") or {}
        current = detail.get("current") if isinstance(detail, dict) else None
        if isinstance(current, int) and isinstance(event.get("id"), str):
            self._progress[event["id"]] = current
            total = sum(self._progress.values())
            if total > self.cap:
                self.over_cap = total

    def _abort(self) -> None:
        sock = getattr(self._sock, "_sock", self._sock)
        with contextlib.suppress(OSError, AttributeError):
            sock.shutdown(socket.SHUT_RDWR)
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.close()


def _engine_refusal(ref: ImageRef, text: str) -> ExecutorError:
    """dockerd's pull error as ours: unknown manifests are the job's, the rest the node's."""
    lowered = text.lower()
    if "manifest unknown" in lowered or "not found" in lowered or "does not match" in lowered:
        return ImagePullError(f"cannot pull {ref}: {text}")
    return ImagePullUnavailableError(f"pull of {ref} failed: {text}")
