"""The HTTP side of :mod:`gridmarket.registry_policy`: a ``requests`` session that connects
only to addresses a :class:`~gridmarket.registry_policy.RegistryPolicy` allows, checked at each
connection, so a registry name that resolves to a forbidden address the second time (DNS
rebinding) gets no connection. Apart from the policy so that loading the policy (the agent's
config, the scheduler, the front end) loads no HTTP stack.
"""

from __future__ import annotations

import os
import socket
from typing import Any, ClassVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

from gridmarket.registry_policy import RegistryPolicy, RegistryRefusedError

__all__ = ["guarded_session"]


# --------------------------------------------------------------------------- HTTP


class _GuardedConnection(HTTPConnection):
    guard: ClassVar[RegistryPolicy]

    def _new_conn(self) -> socket.socket:
        try:
            addresses = self.guard.addresses(self._dns_host, self.port)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        error: OSError | None = None
        for address in addresses:
            try:
                return connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                raise ConnectTimeoutError(
                    self, f"Connection to {self.host} ({address}) timed out"
                ) from exc
            except OSError as exc:
                error = exc
        raise NewConnectionError(self, f"Failed to establish a new connection: {error}")


class _GuardedHTTPSConnection(_GuardedConnection, HTTPSConnection):
    pass


class _GuardedAdapter(HTTPAdapter):
    def __init__(self, policy: RegistryPolicy) -> None:
        self._policy = policy
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        guard = self._policy

        class Plain(_GuardedConnection):
            pass

        class Tls(_GuardedHTTPSConnection):
            pass

        Plain.guard = Tls.guard = guard

        class PlainPool(HTTPConnectionPool):
            ConnectionCls = Plain

        class TlsPool(HTTPSConnectionPool):
            ConnectionCls = Tls

        self.poolmanager.pool_classes_by_scheme = {"http": PlainPool, "https": TlsPool}

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        raise RegistryRefusedError(proxy, "registry requests never go through a proxy")


def guarded_session(policy: RegistryPolicy) -> requests.Session:
    """A ``requests`` session that connects only to addresses ``policy`` allows, checked at
    each connection (:class:`RegistryRefusedError` otherwise; no proxy from the environment)."""
    session = requests.Session()
    # No proxy from the environment; but the CA bundle it names (REQUESTS_CA_BUNDLE, then
    # CURL_CA_BUNDLE, as requests reads them) still applies: that is how an operator trusts a
    # registry's own certificate (the devstack's registry off loopback is self-signed).
    session.trust_env = False
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    adapter = _GuardedAdapter(policy)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
