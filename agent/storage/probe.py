"""Whether the node's IPFS daemon answers at all: a probe with no IPFS client behind it, so that
loading it costs the daemon nothing (the agent's footprint: docs/agent.md)."""

from __future__ import annotations

__all__ = ["IpfsProbe"]


class IpfsProbe:
    """Whether the IPFS daemon's RPC API answers at all (``POST /api/v0/version``).

    Cheap (no ``ipfshttpclient`` import): the daemon calls it before polling while IPFS was
    seen down, and the runner to tell an IPFS outage from a missing dataset.
    """

    def __init__(self, api_url: str, timeout_s: float = 3.0) -> None:
        self.url = api_url.rstrip("/") + "/api/v0/version"
        self.timeout_s = timeout_s

    def __call__(self) -> bool:
        import httpx

        try:
            # the CA bundle only for an https API (as NodeSession): ~1 MB of RSS kept otherwise
            response = httpx.post(
                self.url, timeout=self.timeout_s, verify=self.url.startswith("https://")
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200
