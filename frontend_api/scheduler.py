"""A small async client of the scheduler's JSON API (paths from :class:`gridmarket.wire.API`)."""

from __future__ import annotations

from typing import Any

import httpx

from gridmarket.checkpoints import JOB_CHECKPOINTS
from gridmarket.joblogs import JOB_LOGS
from gridmarket.wire import API


class SchedulerError(RuntimeError):
    """The scheduler could not be reached, or answered with an error; ``status`` is its HTTP
    status (502 when it could not be reached)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class SchedulerClient:
    """Calls the front end makes: info, jobs, nodes, quotes, and a spot job's reveal."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SchedulerError(
                f"scheduler at {self.base_url} unreachable: {type(exc).__name__} {exc}"
            ) from exc

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            if isinstance(detail, list):  # FastAPI's validation errors: "where: what" each
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}"
                    if isinstance(e, dict)
                    else str(e)
                    for e in detail[:5]
                )
            raise SchedulerError(f"scheduler: {detail}", response.status_code)
        return response.json()

    async def info(self) -> dict[str, Any]:
        data: dict[str, Any] = self._json(await self._request("GET", API.INFO))
        return data

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """The scheduler's view of a job; None while it has not seen the job (404)."""
        response = await self._request("GET", API.JOB.format(job_id=job_id))
        if response.status_code == 404:
            return None
        data: dict[str, Any] = self._json(response)
        return data

    async def jobs(self, **params: Any) -> dict[str, Any]:
        query = {k: v for k, v in params.items() if v is not None}
        data: dict[str, Any] = self._json(await self._request("GET", API.JOBS, params=query))
        return data

    async def nodes(self, limit: int = 5000) -> dict[str, Any]:
        data: dict[str, Any] = self._json(
            await self._request("GET", API.NODES, params={"limit": limit})
        )
        return data

    async def quote(self, body: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = self._json(await self._request("POST", API.QUOTE, json=body))
        return data

    async def spot(self, job_id: str) -> dict[str, Any] | None:
        """A spot job's policy and reveal (``wire.SpotStatus``); None when the scheduler has
        none for it (404, or a scheduler without the endpoint)."""
        response = await self._request("GET", API.SPOT.format(job_id=job_id))
        if response.status_code in (404, 405):
            return None
        data: dict[str, Any] = self._json(response)
        return data

    async def logs(self, job_id: str, after: int = 0) -> dict[str, Any] | None:
        """A page of a job's live log lines (``gridmarket.joblogs.JOB_LOGS``) after the cursor
        ``after``; None while the scheduler does not know the job (404, or a scheduler without
        live logs)."""
        response = await self._request(
            "GET", JOB_LOGS.format(job_id=job_id), params={"after": after}
        )
        if response.status_code in (404, 405):
            return None
        data: dict[str, Any] = self._json(response)
        return data

    async def checkpoints(self, job_id: str) -> dict[str, Any] | None:
        """A checkpointing job's newest checkpoints and progress points
        (``gridmarket.checkpoints.JOB_CHECKPOINTS``, as JSON: hostile, see
        :func:`frontend_api.progress.normalize`); None while the scheduler does not know the job
        (404, or a scheduler without checkpoints)."""
        response = await self._request("GET", JOB_CHECKPOINTS.format(job_id=job_id))
        if response.status_code in (404, 405):
            return None
        data: dict[str, Any] = self._json(response)
        return data

    async def reveal_spot(self, job_id: str, seed: str) -> dict[str, Any]:
        """``POST`` a settled spot job's seed (``wire.SpotReveal``); :class:`SchedulerError` with
        the scheduler's status (409 while the job is not settled)."""
        response = await self._request("POST", API.SPOT.format(job_id=job_id), json={"seed": seed})
        data: dict[str, Any] = self._json(response)
        return data
