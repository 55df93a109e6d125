"""Which registries a job's image may come from: the one address classifier, and the policy the
agent, the scheduler and the front end apply with it.

A job names its registry (``host[:port]/name@sha256:...``), and whoever pulls it connects there:
a submitter could make every provider's agent (and its dockerd) send requests into the provider's
own network, or to a cloud's metadata service. So a registry is allowed only when it is public,
or when the configuration lists it by name (``host`` or ``host:port``, e.g. a devnet's registry
on loopback). :func:`address_problem` says why an address is not public: unspecified, loopback,
private, shared (carrier-grade NAT), link-local, multicast, a cloud metadata service, a reserved
or documentation range; IPv6 too, with the IPv4 address inside an IPv4-mapped, NAT64 or 6to4
address judged as IPv4.

* :meth:`RegistryPolicy.check` (no DNS; the scheduler's spec intake and the front end's
  ``/api/jobs/prepare``): IP literals in any form ``inet_aton`` takes (``127.1``,
  ``0x7f000001``), ``localhost`` and ``*.localhost``, metadata host names.
* :meth:`RegistryPolicy.addresses` (the agent, before it pulls): the static check, then the name
  resolved and every address checked; one forbidden address refuses the registry.
* :func:`gridmarket.registry_session.guarded_session` (a module of its own, so that loading
  the policy loads no HTTP stack: the agent's daemon without an RPC URL stays light): a
  ``requests`` session whose every connection (redirects and token servers included) resolves,
  checks, and connects only to an address it checked (a name that resolves elsewhere the
  second time, DNS rebinding, gets no connection). No proxy is used.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "PUBLIC",
    "RegistryPolicy",
    "RegistryRefusedError",
    "address_problem",
    "host_problem",
]

PUBLIC = "public"
"""The allow-list entry that admits every registry whose addresses are all public."""

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS VPC DNS
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer (a public address)
        "fd00:ec2::254",  # AWS over IPv6
    )
)
METADATA_NAMES = frozenset(
    ("metadata", "metadata.google.internal", "metadata.goog", "instance-data",
     "instance-data.ec2.internal", "metadata.azure.com")
)  # fmt: skip

_V4 = [
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "an unspecified (this-network) address"),
        ("10.0.0.0/8", "a private address"),
        ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", "a link-local address"),
        ("172.16.0.0/12", "a private address"),
        ("192.168.0.0/16", "a private address"),
        ("224.0.0.0/4", "a multicast address"),
        ("255.255.255.255/32", "the broadcast address"),
        ("240.0.0.0/4", "a reserved address"),
    )
]
_V6 = [
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("::/128", "the unspecified address"),
        ("::1/128", "a loopback address"),
        ("::/8", "a reserved address (IPv4-compatible and the like)"),
        ("fc00::/7", "a private (unique local) address"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a site-local address"),
        ("ff00::/8", "a multicast address"),
    )
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class RegistryRefusedError(ValueError):
    """A registry the policy refuses. ``by_list``: it is public, but the policy admits only the
    registries it lists (the refusing party's own choice, not a fault of the image)."""

    def __init__(self, registry: str, why: str, *, by_list: bool = False) -> None:
        super().__init__(f"registry {registry} is refused: {why}")
        self.registry = registry
        self.why = why
        self.by_list = by_list


def address_problem(address: str | IP) -> str | None:
    """Why ``address`` is no public address a registry may be on; None when it is public."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ipaddress.IPv6Address(ip.packed)  # without a scope id
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in _NAT64:
            inner = ipaddress.IPv4Address(ip.packed[-4:])
        if inner is not None:
            why = address_problem(inner)
            return None if why is None else f"{why} ({inner}, inside the IPv6 address)"
    if ip in METADATA:
        return "a cloud metadata service address"
    for net, why in _V4 if ip.version == 4 else _V6:
        if ip in net:
            return why
    if not ip.is_global:
        return "not a public address (a special-purpose range)"
    return None


def host_problem(host: str) -> str | None:
    """Why the host name (no port) ``host`` is no public registry, without DNS: an IP literal
    (any form ``inet_aton`` reads) that :func:`address_problem` refuses, ``localhost``, or a
    cloud metadata service's name. None otherwise."""
    name = host.strip("[]").rstrip(".").lower()
    ip = _literal(name)
    if ip is not None:
        why = address_problem(ip)
        return None if why is None else f"{ip} is {why}"
    if name == "localhost" or name.endswith(".localhost"):
        return f"{name} is a loopback name"
    if name in METADATA_NAMES:
        return f"{name} is a cloud metadata service's name"
    return None


def _literal(name: str) -> IP | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    if name and all(c in "0123456789abcdefx." for c in name) and any(c.isdigit() for c in name):
        try:  # 127.1, 2130706433, 0x7f.0.0.1: what the resolver reads as an IPv4 address
            return ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return None
    return None


def split_host(registry: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` for IPv6) -> (host, port or None), the host lower-case and
    an IP literal in its canonical form. ValueError when it is not one."""
    text = registry.strip().lower()
    if not text or any(c in text for c in "/@ \t"):
        raise ValueError(f"not host[:port]: {registry!r}")
    port: str | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"not host[:port]: {registry!r}")
        port = rest[1:] if rest else None
    elif text.count(":") > 1:
        host = text  # a bare IPv6 address
    else:
        host, _, port = text.partition(":")
        port = port or None
    host = host.rstrip(".")
    if not host:
        raise ValueError(f"not host[:port]: {registry!r}")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"bad port in {registry!r}")
    ip = _literal(host)
    return (str(ip) if ip is not None else host), (int(port) if port else None)


def _system_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class RegistryPolicy:
    """The registries allowed: ``public`` (every registry whose addresses are all public) and
    ``host`` / ``host:port`` entries (allowed whatever their addresses; a host without a port
    allows all its ports). ``setting`` names the configuration in refusals. ``resolver``:
    host, port -> addresses (the system's resolver)."""

    allow: tuple[str, ...] = (PUBLIC,)
    setting: str = "the registry allow-list"
    resolver: Callable[[str, int], list[str]] = field(default=_system_resolve, compare=False)
    _listed: frozenset[tuple[str, int | None]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        listed = set()
        for entry in self.allow:
            if entry.strip().lower() != PUBLIC:
                listed.add(split_host(entry))
        object.__setattr__(self, "_listed", frozenset(listed))

    @classmethod
    def of(cls, entries: Iterable[str], setting: str) -> RegistryPolicy:
        """The policy of a configuration's list (ValueError naming a bad entry)."""
        return cls(tuple(entries), setting)

    @property
    def public(self) -> bool:
        return any(e.strip().lower() == PUBLIC for e in self.allow)

    def listed(self, host: str, port: int | None) -> bool:
        return (host, None) in self._listed or (port is not None and (host, port) in self._listed)

    def check(self, registry: str) -> None:
        """Refuse ``registry`` (``host[:port]``) on what its name shows, without DNS:
        :class:`RegistryRefusedError` saying why."""
        try:
            host, port = split_host(registry)
        except ValueError as exc:
            raise RegistryRefusedError(registry, str(exc)) from None
        self._check_name(registry, host, port or self._default_port(host))

    def addresses(self, registry: str, port: int | None = None) -> list[str]:
        """The addresses to connect to for ``registry`` (``host[:port]``; ``port`` when it has
        none), each checked: :class:`RegistryRefusedError` when one is forbidden (or the
        registry is not allowed), ``socket.gaierror`` when the name does not resolve."""
        try:
            host, named = split_host(registry)
        except ValueError as exc:
            raise RegistryRefusedError(registry, str(exc)) from None
        port = named or port or self._default_port(host)
        if self._check_name(registry, host, port):
            return [host] if _literal(host) is not None else self.resolver(host, port)
        ip = _literal(host)
        found = [str(ip)] if ip is not None else self.resolver(host, port)
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        for address in found:
            why = address_problem(address)
            if why is not None:
                why = f"{host} resolves to {address}, {why}{self._hint}"
                raise RegistryRefusedError(registry, why)
        return found

    def refusal(self, image: str) -> str | None:
        """Why a job's ``image`` is refused for its registry (static check); None when allowed
        or when it names no registry (a short name is Docker Hub's) or does not parse."""
        # imported here: gridmarket.images loads requests, which the agent's daemon without an
        # RPC URL never needs (tests/agent/test_cli.py, its heavy modules)
        from gridmarket.images import ImageRefError, parse_image_ref

        try:
            ref = parse_image_ref(image)
        except ImageRefError:
            return None
        if ref.host is None:
            return None
        try:
            self.check(ref.host)
        except RegistryRefusedError as exc:
            return f"image {image}: {exc}"
        return None

    # ------------------------------------------------------------------ steps

    @property
    def _hint(self) -> str:
        return f" (only public registries, and those {self.setting} lists, are allowed)"

    def _check_name(self, registry: str, host: str, port: int | None) -> bool:
        """True when ``host`` is listed; raises when its name alone refuses it."""
        if self.listed(host, port):
            return True
        why = host_problem(host)
        if why is not None:
            raise RegistryRefusedError(registry, why + self._hint)
        if not self.public:
            names = ", ".join(sorted(f"{h}:{p}" if p else h for h, p in self._listed)) or "none"
            raise RegistryRefusedError(
                registry, f"not among the registries {self.setting} lists ({names})", by_list=True
            )
        return False

    @staticmethod
    def _default_port(host: str) -> int:
        """A registry named without a port: plain HTTP on loopback (as dockerd and
        :class:`gridmarket.images.RegistryClient` do), HTTPS elsewhere."""
        ip = _literal(host)
        return 80 if host == "localhost" or (ip is not None and ip.is_loopback) else 443
