"""The verification choice and a replicated job's page in a real browser (Debian's Chromium,
npm playwright-core, tests/frontend/browser/replicas.cjs, the injected wallet of run.cjs):
the submit page shows what ``replicate:2`` costs, disables on-verify payment with it, refuses
an image tag naming ``spec.image``, funds ``createReplicated`` from the wallet and opens seat
0's page with the group; while the page watches, two providers deliver the same output by hand
and the group is resolved, and the verdict arrives live."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from gridmarket.chain import ChainError
from gridmarket.cid import bytes_cid
from gridmarket.escrow import Status
from tests.frontend.conftest import FrontendStack
from tests.frontend.test_browser import ROOT, _browser_env, _result, _wait_file
from tests.frontend.test_replicas_api import PINNED, registered

SCRIPT = Path(__file__).resolve().parent / "browser" / "replicas.cjs"


def test_replicate_choice_and_live_verdict_in_chromium(
    stack: FrontendStack, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    signal = tmp_path / "signal"
    env = _browser_env(stack, shots, GM_IMAGE=PINNED, GM_SIGNAL=str(signal))
    script = subprocess.Popen(
        ["node", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        _wait_file(signal, script, timeout=120)
        seat0 = signal.read_text().strip()
        view = stack.wait_chain(seat0, "funded")
        seats = view["group"]["seat_ids"]
        providers = [stack.manual_provider, registered(stack, stack.devnet.providers[1])]
        output = bytes_cid(b"the browser's agreed output\n")
        for seat, provider in zip(seats, providers, strict=True):
            stack.assign_by_hand(seat, provider)
            stack.submit_by_hand(seat, output)
        states = [stack.chain_job(s) for s in seats]
        if any(s.status is Status.SUBMITTED for s in states):
            with contextlib.suppress(ChainError):  # the scheduler may have resolved it first
                stack.client().resolve(
                    stack.devnet.providers[1], bytes.fromhex(view["group"]["group_id"][2:]), states
                )
        stdout, stderr = script.communicate(timeout=180)
    except AssertionError as exc:
        if script.poll() is None:
            script.kill()
        out, err = script.communicate()
        raise AssertionError(f"{exc}\n{out}\n{err}") from None
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    result = _result(script.returncode, stdout, stderr, shots)

    assert "k distinct providers" in result["replicate_hint"]
    assert result["on_verify_disabled"] is True
    assert result["use_quote"].endswith("as bounty (2 runs)"), result["use_quote"]
    assert "must divide by 2: 1 wei too many" in result["price_odd"]
    assert result["price"] == (
        "You pay 0.004 ETH for 2 runs (0.002 ETH per seat); each of the 2 providers locks "
        "0.002 ETH of collateral."
    )
    assert result["price_state"] == "replicate:2"
    assert "pinned by digest" in result["image_error"]
    assert "deterministic: true" in result["deterministic_error"]
    assert result["job_id"] == seat0 == seats[0]
    assert result["seat_rows"] == 2 and result["pending"] == 1
    assert result["agreeing"] == "2" and "2 of 2" in result["verdict_text"]
    assert output in result["verdict_text"]
    assert result["seat_states"] == ["released", "released"]
    assert result["badges"] == ["released", "agrees", "released", "agrees"]
    for seat in seats:
        assert stack.chain_job(seat).status is Status.RELEASED
