"""The front end refuses a job whose image names a registry on a loopback, private, link-local or
metadata address (issue 32, item 4): ``POST /api/jobs/prepare``, dry run included, answers 400
naming ``spec.image``, the registry and why, and nothing is sent to that registry. The registry
the front end advertises (on loopback in the test stack) is allowed: it is configured."""

from __future__ import annotations

import pytest

from tests.frontend.conftest import FrontendStack, unrunnable_spec
from tests.probe import Probe

DIGEST = "@sha256:" + "d" * 64


@pytest.mark.parametrize("dry_run", [True, False])
def test_prepare_refuses_a_registry_no_agent_would_pull_from(
    stack: FrontendStack, dry_run: bool
) -> None:
    with Probe("127.0.0.2") as probe:
        cases = [
            (probe.image(), f"registry {probe.registry}", "127.0.0.2 is a loopback address"),
            (f"localhost:{probe.port}/x{DIGEST}", "registry localhost", "loopback name"),
            (f"127.1:{probe.port}/x{DIGEST}", "registry 127.1", "127.0.0.1 is a loopback"),
            (f"169.254.169.254/x{DIGEST}", "registry 169.254.169.254", "cloud metadata"),
            (f"192.168.0.1:5000/x{DIGEST}", "registry 192.168.0.1:5000", "private address"),
            ("10.0.0.1:5000/x:latest", "registry 10.0.0.1:5000", "private address"),
        ]
        for image, registry, why in cases:
            body = {
                "from": stack.submitter.address,
                "spec": unrunnable_spec(image=image),
                "bounty_eth": "0.01",
                "ttl_s": 3600,
                "dry_run": dry_run,
            }
            response = stack.post("/api/jobs/prepare", json=body)
            assert response.status_code == 400, (image, response.text)
            error = response.json()
            assert error["field"] == "spec.image", error
            assert registry in error["detail"] and why in error["detail"], error
            assert "image_registries" in error["detail"], error
        assert probe.connections == []


def test_prepare_accepts_public_and_the_advertised_registry(stack: FrontendStack) -> None:
    advertised = stack.get("/api/info").json()["registry"]
    assert advertised.startswith("127.0.0.1:")  # loopback: allowed because it is configured
    for image in (f"{advertised}/gridmarket/busybox{DIGEST}", f"ghcr.io/x/y{DIGEST}"):
        body = {
            "from": stack.submitter.address,
            "spec": unrunnable_spec(image=image),
            "bounty_eth": "0.01",
            "ttl_s": 3600,
            "dry_run": True,
        }
        response = stack.post("/api/jobs/prepare", json=body)
        assert response.status_code == 200, (image, response.text)
