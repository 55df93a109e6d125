"""The contracts' ABIs and creation bytecode, from Ape's compile: the one compile pipeline.

Ape (ape-solidity driving py-solc-x with the offline npm compiler, ``$SOLCX_BINARY_PATH``,
settings in ``ape-config.yaml``) compiles ``contracts/`` into its project manifest,
``.build/__local__.json``. The tests, ``ape run deploy`` and :func:`load_artifacts` all read
that output, so the deployed bytecode is the bytecode that was tested.

Where the artifacts come from:

- **source checkout** (``contracts/`` and ``ape-config.yaml`` next to the package): Ape's
  manifest. If it is missing, or its sources differ from the files on disk, ``ape compile`` is
  run first. The deployable contracts are then exported to ``gridmarket/_compiled/contracts.json``
  (package data: a wheel built afterwards carries them).
- **installed package** (no source tree): the exported ``gridmarket/_compiled/contracts.json``.
- **an explicit path** (``load_artifacts(path)``): an Ape manifest or an exported file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EXPORTED", "Artifact", "BuildError", "load_artifacts"]

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
CONTRACTS_DIR = ROOT / "contracts"
APE_MANIFEST = ROOT / ".build" / "__local__.json"
EXPORTED = PACKAGE / "_compiled" / "contracts.json"
# Contracts under contracts/test/ exist for the tests only and are never exported.
_TEST_DIR = "contracts/test/"


class BuildError(RuntimeError):
    """The contracts' artifacts could not be found or compiled (the message says why)."""


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: str


def load_artifacts(path: Path | None = None, *, include_tests: bool = False) -> dict[str, Artifact]:
    """Every deployable contract (not interfaces, not test helpers) by name.

    ``path``: an Ape manifest or an exported ``contracts.json``; by default the source tree's
    Ape manifest (compiled first if stale) or, for an installed package, the exported copy.
    ``include_tests`` adds the test helpers of ``contracts/test/`` (read from an Ape manifest
    only: they are never exported).
    """
    if path is not None:
        return _read(path, include_tests=include_tests)
    if _is_source_checkout():
        if _stale(APE_MANIFEST):
            _ape_compile()
            if _stale(APE_MANIFEST):
                raise BuildError(
                    f"`ape compile` ran but {APE_MANIFEST} still does not match contracts/"
                )
        artifacts = _read(APE_MANIFEST)
        _export(artifacts)
        return _read(APE_MANIFEST, include_tests=True) if include_tests else artifacts
    if not EXPORTED.exists():
        raise BuildError(
            f"no compiled contracts at {EXPORTED}: build the package from a source checkout "
            "after `ape compile` (the export is written by gridmarket.build.load_artifacts)"
        )
    return _read(EXPORTED)


def _is_source_checkout() -> bool:
    return CONTRACTS_DIR.is_dir() and (ROOT / "ape-config.yaml").is_file()


def _sources_on_disk() -> dict[str, str]:
    return {
        str(f.relative_to(ROOT)): f.read_text()
        for f in sorted(CONTRACTS_DIR.rglob("*.sol"))
        if f.is_file() and ".cache" not in f.relative_to(CONTRACTS_DIR).parts  # Ape's imports
    }


def _stale(manifest: Path) -> bool:
    """Whether ``manifest`` is missing or was compiled from other sources than those on disk."""
    try:
        sources = json.loads(manifest.read_text()).get("sources") or {}
    except (OSError, ValueError):
        return True
    compiled = {sid: (src or {}).get("content") for sid, src in sources.items()}
    return compiled != _sources_on_disk()


def _ape_compile() -> None:
    """Run ``ape compile`` in the source tree (the same command ``make compile`` runs)."""
    ape = shutil.which("ape") or str(Path(sys.executable).with_name("ape"))
    env = dict(os.environ)
    env.setdefault("SOLCX_BINARY_PATH", str(ROOT / "tools" / "solc"))
    bin_dir = str(ROOT / "node_modules" / ".bin")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    try:
        done = subprocess.run(
            [ape, "compile"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"`ape compile` could not run ({ape}): {exc}") from exc
    if done.returncode != 0:
        raise BuildError(f"`ape compile` failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")


def _read(path: Path, *, include_tests: bool = False) -> dict[str, Artifact]:
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"no compiled contracts at {path}") from None
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path} is not readable JSON: {exc}") from exc
    try:
        if "contractTypes" in body:  # an Ape manifest
            out: dict[str, Artifact] = {}
            for name, ct in body["contractTypes"].items():
                code = (ct.get("deploymentBytecode") or {}).get("bytecode")
                if not code or code == "0x":
                    continue  # interfaces, abstract contracts
                if not include_tests and str(ct.get("sourceId", "")).startswith(_TEST_DIR):
                    continue  # test helpers
                out[name] = Artifact(name, list(ct["abi"]), str(code))
            return out
        return {
            name: Artifact(name, list(a["abi"]), str(a["bytecode"]))
            for name, a in body["contracts"].items()
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise BuildError(f"{path} is neither an Ape manifest nor an export: {exc!r}") from exc


def _export(artifacts: dict[str, Artifact]) -> None:
    body = {
        "source": "ape compile (.build/__local__.json)",
        "contracts": {n: {"abi": a.abi, "bytecode": a.bytecode} for n, a in artifacts.items()},
    }
    text = json.dumps(body, indent=1, sort_keys=True) + "\n"
    if EXPORTED.exists() and EXPORTED.read_text() == text:
        return
    EXPORTED.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=EXPORTED.parent, delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, EXPORTED)
