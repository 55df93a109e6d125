"""The submitter CLI's spot checks (``--verification spot:p``): the seed drawn here, sealed to the
job's mediator, kept in the submitter's local state until the job is settled, then revealed.

- :func:`mediator_key`: the public key to seal to: ``--mediator-pubkey``, else the deployment's
  ``mediator_pubkey`` (``/api/info`` params) for its listed mediator, else the submitter's own
  key for a self-mediated job; always checked against the mediator's address
  (:func:`gridmarket.spot.check_public_key`), so a front end cannot make the CLI seal a seed to
  a key the mediator does not hold.
- :class:`SeedStore`: ``<the keystore's folder>/spot/<job id>.json`` (folder 0700, file 0600):
  the seed, p, the commitment, the mediator and the spec's CID. Written before the funding
  transaction is relayed (a job funded without its seed kept would leave the reveal to the
  mediator alone), removed again when the funding fails.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridmarket import spot

from .submitter_client import CliError


def mediator_key(
    mediator: str, given: str | None, info: dict[str, Any], own_key: bytes, own_address: str
) -> bytes:
    """The compressed public key to seal a spot job's seed to (see the module's docstring)."""
    params = info.get("params") or {}
    listed = str(params.get("mediator") or info.get("mediator") or "")
    if given:
        text, where = given, "--mediator-pubkey"
    elif mediator.lower() == own_address.lower():
        return spot.public_key_of(own_key)  # a self-mediated job: the submitter opens it
    elif params.get("mediator_pubkey") and listed.lower() == mediator.lower():
        text, where = str(params["mediator_pubkey"]), "the deployment's mediator_pubkey"
    else:
        raise CliError(
            f"spot checks seal the seed to the mediator's public key, and none is known for "
            f"{mediator}: give --mediator-pubkey 0x... (its secp256k1 key)"
        )
    try:
        raw = bytes.fromhex(text.strip().removeprefix("0x").removeprefix("0X"))
        return spot.check_public_key(raw, mediator)
    except (ValueError, spot.SpotError) as exc:
        raise CliError(f"{where}: not the key of mediator {mediator}: {exc}") from None


def draw(p_bps: int, public_key: bytes, submitter: str) -> tuple[bytes, dict[str, Any]]:
    """A fresh seed and the spec's ``spot`` field for it (commitment and sealed seed, both
    bound to ``submitter``)."""
    seed = spot.new_seed()
    return seed, {
        "p_bps": p_bps,
        "commit": "0x" + spot.commit_of(seed, submitter).hex(),
        "sealed": "0x" + spot.seal(seed, public_key, submitter).hex(),
    }


@dataclass(frozen=True)
class SeedStore:
    """Where the CLI keeps spot seeds: one file per job under ``root`` (``.../spot``)."""

    root: Path

    @classmethod
    def beside(cls, keystore: Path) -> SeedStore:
        return cls(keystore.expanduser().parent / "spot")

    def path(self, job_id: str) -> Path:
        return self.root / f"{job_id.lower()}.json"

    def save(self, job_id: str, seed: bytes, spot_field: dict[str, Any], **extra: Any) -> Path:
        """Write the seed (0600, never overwriting: a job id names one job)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(job_id)
        body = {
            "job_id": job_id.lower(),
            "seed": "0x" + seed.hex(),
            "p_bps": spot_field["p_bps"],
            "commit": spot_field["commit"],
            "created_at": int(time.time()),
            **extra,
        }
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise CliError(f"{path} exists: a seed is already kept for job {job_id}") from None
        except OSError as exc:
            raise CliError(f"cannot keep the spot seed in {path}: {exc.strerror}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(body, out, indent=2)
        return path

    def load(self, job_id: str) -> dict[str, Any]:
        """The kept record, its seed checked against its commitment; CliError otherwise."""
        path = self.path(job_id)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            seed = bytes.fromhex(str(body["seed"]).removeprefix("0x"))
            commit = bytes.fromhex(str(body["commit"]).removeprefix("0x"))
        except FileNotFoundError:
            raise CliError(
                f"no spot seed kept for job {job_id} in {self.root} (the job's mediator "
                "reveals it too)"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"{path} is not a spot seed record: {exc}") from None
        if not spot.verify_reveal(seed, commit, str(body.get("submitter", ""))):
            raise CliError(f"{path}: its seed does not open its commitment")
        return dict(body)

    def mark_revealed(self, job_id: str) -> None:
        """Note the reveal in the record (best effort: the seed is public from now on)."""
        path = self.path(job_id)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            body["revealed_at"] = int(time.time())
            path.write_text(json.dumps(body, indent=2), encoding="utf-8")
        except (OSError, ValueError):
            pass

    def forget(self, job_id: str) -> None:
        self.path(job_id).unlink(missing_ok=True)


def drawn_attempts(seed_hex: str, p_bps: int, attempts: int) -> list[int]:
    """The attempts 1..``attempts`` the seed draws for a check."""
    seed = bytes.fromhex(seed_hex.removeprefix("0x"))
    return [a for a in range(1, min(attempts, 2**16 - 1) + 1) if spot.checked(seed, a, p_bps)]
