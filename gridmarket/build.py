"""Compile the contracts with py-solc-x and the offline npm compiler (tools/solc).

Ape compiles the same sources for the tests; both read the compiler settings from
``ape-config.yaml`` so the deployed bytecode is the bytecode that was tested. Results are cached
in ``.build/gridmarket-artifacts.json`` keyed by a hash of the sources and settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS_DIR = ROOT / "contracts"
CACHE = ROOT / ".build" / "gridmarket-artifacts.json"
SOLC_DIR = ROOT / "tools" / "solc"


class BuildError(RuntimeError):
    """The contracts could not be compiled (the message carries the compiler's errors)."""


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: str


def _settings() -> tuple[str, dict[str, Any]]:
    config = yaml.safe_load((ROOT / "ape-config.yaml").read_text())["solidity"]
    settings: dict[str, Any] = {
        "optimizer": {
            "enabled": bool(config.get("optimize", True)),
            "runs": int(config.get("optimization_runs", 200)),
        },
        "evmVersion": config.get("evm_version", "prague"),
        "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}},
    }
    if config.get("via_ir"):
        settings["viaIR"] = True
    return str(config["version"]), settings


def _sources(include_tests: bool) -> dict[str, dict[str, str]]:
    files = sorted(CONTRACTS_DIR.rglob("*.sol"))
    if not include_tests:
        files = [f for f in files if "test" not in f.relative_to(CONTRACTS_DIR).parts[:-1]]
    return {f"contracts/{f.relative_to(CONTRACTS_DIR)}": {"content": f.read_text()} for f in files}


def compile_contracts(*, include_tests: bool = False) -> dict[str, Artifact]:
    """Compile every contract under ``contracts/`` and return its ABI and creation bytecode."""
    version, settings = _settings()
    sources = _sources(include_tests)
    key = hashlib.sha256(json.dumps([version, settings, sources], sort_keys=True).encode())
    if CACHE.exists():
        cached = json.loads(CACHE.read_text())
        if cached.get("key") == key.hexdigest():
            return {n: Artifact(n, a["abi"], a["bytecode"]) for n, a in cached["out"].items()}

    import solcx  # the only importer of py-solc-x

    binary = Path(os.environ.get("SOLCX_BINARY_PATH", SOLC_DIR)) / f"solc-v{version}"
    if not binary.exists():
        raise BuildError(f"no compiler at {binary}: run `make setup` (scripts/setup.sh)")
    try:
        result = solcx.compile_standard(
            {"language": "Solidity", "sources": sources, "settings": settings},
            base_path=str(ROOT),
            solc_binary=str(binary),
        )
    except solcx.exceptions.SolcError as exc:
        raise BuildError(str(exc)) from exc
    errors = [e for e in result.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise BuildError("\n".join(e.get("formattedMessage", str(e)) for e in errors))
    out: dict[str, Artifact] = {}
    for contracts in result["contracts"].values():
        for name, data in contracts.items():
            code = data["evm"]["bytecode"]["object"]
            if code:  # skip interfaces and abstract contracts
                out[name] = Artifact(name, data["abi"], "0x" + code)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(
        json.dumps(
            {
                "key": key.hexdigest(),
                "out": {n: {"abi": a.abi, "bytecode": a.bytecode} for n, a in out.items()},
            }
        )
    )
    return out
