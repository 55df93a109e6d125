"""A job funded by an outside client (issue 11 item 5): only foundry's ``cast``, ``curl`` against
the submitter's IPFS node's HTTP RPC API, ``jq`` and coreutils, as docs/protocol.md tells.

Every shell command here is a constant that docs/protocol.md holds verbatim
(:func:`test_the_doc_holds_every_command`): the test runs the doc's commands, so the doc stays
true. The grid is real (anvil + escrow, js-ipfs nodes on a loopback swarm, the scheduler, the
mediator and one agent); only the submitter's side is the outside client.

    .venv/bin/python -m pytest tests/e2e/test_outside_client.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import wasmtime
from eth_utils.crypto import keccak
from multiformats import CID

from devstack._process import ServiceError
from devstack.grid import LocalGrid, run_grid
from gridmarket.cid import bytes_cid, normalize_cid, path_cid, same_cid
from gridmarket.escrow import seat_ids
from gridmarket.wire import JobSpec

from .conftest import FAST, FAST_ESCROW
from .support import CSVSTATS, DATASET, SMALL, job_view, wait_for, wait_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
BOUNTY = 10**16  # the doc's
WINDOW_OPEN = "JobEscrowChallengeWindowOpen(bytes32,uint256,uint256)"
TOO_EARLY = "JobEscrowDeadlineNotPassed(bytes32,uint256,uint256)"
BIN = ROOT / "node_modules" / ".bin"

# ------------------------------------------------------------------ the doc's commands

ADD_MODULE = r"""
MODULE_CID=$(curl -s -X POST -F file=@csvstats.wasm \
  "$IPFS_API/api/v0/add?cid-version=1&raw-leaves=true&cid-base=base32" | jq -r .Hash)
""".strip()
ADD_DATASET = r"""
DATASET_CID=$(curl -s -X POST -F file=@data.csv \
  "$IPFS_API/api/v0/add?cid-version=1&raw-leaves=true&cid-base=base32&wrap-with-directory=true" \
  | jq -r 'select(.Name == "") | .Hash')
""".strip()
ADD_SPEC = r"""
SPEC_CID=$(curl -s -X POST -F file=@spec.json \
  "$IPFS_API/api/v0/add?cid-version=1&raw-leaves=true&cid-base=base32" | jq -r .Hash)
""".strip()
LOCAL_CID = r"""
LOCAL_CID=b$( (printf '\001\125\022\040'; sha256sum spec.json | cut -c1-64 | tr a-f A-F \
  | basenc --base16 -d) | basenc --base32 | tr -d '=\n' | tr A-Z a-z)
""".strip()
BASE58 = r"""
SPEC_CID_Z=$(curl -s -X POST -F file=@spec.json \
  "$IPFS_API/api/v0/add?cid-version=1&raw-leaves=true&cid-base=base58btc" | jq -r .Hash)
""".strip()
ADD_CHUNKED = r"""
BAD_CID=$(curl -s -X POST -F file=@spec.json \
  "$IPFS_API/api/v0/add?cid-version=1&raw-leaves=true&cid-base=base32&chunker=size-64" \
  | jq -r .Hash)
""".strip()
TERMS = r"""
SUBMITTER=$(cast wallet address --private-key "$KEY")
MEDIATOR=$(cast logs --rpc-url "$RPC" --address "$ESCROW" --from-block 0 --json \
  'MediatorListed(address indexed,bool)' | jq -r '.[-1].topics[1]' | cast parse-bytes32-address)
LISTED=$(cast call --rpc-url "$RPC" "$ESCROW" 'isListedMediator(address)(bool)' "$MEDIATOR")
BOUNTY=10000000000000000
COLLATERAL=$(cast call --rpc-url "$RPC" "$ESCROW" 'minCollateral(uint256)(uint256)' "$BOUNTY" \
  | cut -d' ' -f1)
OPERATOR=$(cast call --rpc-url "$RPC" "$ESCROW" 'operator()(address)')
NOW=$(cast block --rpc-url "$RPC" latest --field timestamp)
DEADLINE=$((NOW + 3600))
SALT=$(cast keccak "my job $(date +%s%N)")
""".strip()
JOB_ID = (
    "JOB_ID=$(cast keccak "
    "$(cast abi-encode 'f(address,bytes32,bytes32)' \"$SUBMITTER\" "
    '"$(cast keccak "$SPEC_CID")" "$SALT"))'
)
CREATE = r"""
cast send --rpc-url "$RPC" --private-key "$KEY" --value "$BOUNTY" --json "$ESCROW" \
  'createJob(bytes32,string,uint40,address,address,uint96,uint8,uint8)' \
  "$SALT" "$SPEC_CID" "$DEADLINE" "$OPERATOR" "$MEDIATOR" "$COLLATERAL" 0 0 > created.json
CREATED_SIG=$(cast sig-event \
  'JobCreated(bytes32,address,uint96,uint40,uint16,address,address,uint96,uint8,address,bytes32,string)')
EVENT_ID=$(jq -r --arg sig "$CREATED_SIG" \
  '.logs[] | select(.topics[0] == $sig) | .topics[1]' created.json)
BLOCK=$(jq -r .blockNumber created.json | cast to-dec)
""".strip()
CREATED_EVENT = "\n".join(CREATE.splitlines()[3:5])
"""The ``CREATED_SIG`` line of :data:`CREATE` alone (section 7 reads seat ids with it)."""
REPLICATE = r"""
K=3
SEAT_BOUNTY=$BOUNTY
GROUP_BOUNTY=$((SEAT_BOUNTY * K))
SEAT_COLLATERAL=$(cast call --rpc-url "$RPC" "$ESCROW" 'minCollateral(uint256)(uint256)' \
  "$SEAT_BOUNTY" | cut -d' ' -f1)
GROUP_SALT=$(cast keccak "my replicated job $(date +%s%N)")
GROUP_ID=$(cast keccak $(cast abi-encode 'f(address,bytes32,bytes32)' "$SUBMITTER" \
  "$(cast keccak "$SPEC_CID")" "$GROUP_SALT"))
SEAT_0=$(cast keccak $(cast abi-encode 'f(bytes32,uint256)' "$GROUP_ID" 0))
cast send --rpc-url "$RPC" --private-key "$KEY" --value "$GROUP_BOUNTY" --json "$ESCROW" \
  'createJob(bytes32,string,uint40,address,address,uint96,uint8,uint8)' \
  "$GROUP_SALT" "$SPEC_CID" "$DEADLINE" "$OPERATOR" "$MEDIATOR" "$SEAT_COLLATERAL" 0 "$K" \
  > replicated.json
""".strip()
SEATS = (
    'SEATS=$(jq -r --arg sig "$CREATED_SIG" '
    "'.logs[] | select(.topics[0] == $sig) | .topics[1]' replicated.json)"
)
FOLLOW = 'curl -s "$SCHEDULER/v1/jobs/$JOB_ID" | jq -r \'.state + ": " + .reason\''
TERMS_FROM_EVENT = r"""
read -r BOUNTY DEADLINE FEE_BPS OPERATOR MEDIATOR COLLATERAL FLAGS TOKEN < <(cast abi-decode \
  'f()(uint96,uint40,uint16,address,address,uint96,uint8,address,bytes32,string)' \
  "$(jq -r --arg sig "$CREATED_SIG" '.logs[] | select(.topics[0] == $sig) | .data' created.json)" \
  | cut -d' ' -f1 | head -8 | paste -sd' ')
""".strip()
JOB_T = (
    "JOB_T='(address,uint96,address,uint40,uint40,uint16,uint16,bytes32,address,address,"
    "uint96,uint40,uint8,address,uint40)'"
)
FUNDED_JOB = (
    'JOB="($SUBMITTER,$BOUNTY,0x0000000000000000000000000000000000000000,$DEADLINE,0,'
    "$FEE_BPS,0,0x0000000000000000000000000000000000000000000000000000000000000000,"
    '$OPERATOR,$MEDIATOR,$COLLATERAL,0,$FLAGS,$TOKEN,0)"'
)
IS_CURRENT = (
    'CURRENT=$(cast call --rpc-url "$RPC" "$ESCROW" "isCurrent(bytes32,$JOB_T)(bool)" '
    '"$JOB_ID" "$JOB")'
)
RESULT_FROM_EVENT = r"""
cast logs --rpc-url "$RPC" --address "$ESCROW" --from-block "$BLOCK" --json \
  'ResultSubmitted(bytes32 indexed,address indexed,uint16,uint40,string)' "$JOB_ID" > result.json
PROVIDER=$(jq -r '.[-1].topics[2]' result.json | cast parse-bytes32-address)
read -r ATTEMPT SINCE OUTPUT_CID < <(cast abi-decode 'f()(uint16,uint40,string)' \
  "$(jq -r '.[-1].data' result.json)" | cut -d' ' -f1 | tr -d '"' | paste -sd' ')
SUBMITTED_JOB="($SUBMITTER,$BOUNTY,$PROVIDER,$DEADLINE,$SINCE,$FEE_BPS,$ATTEMPT,\
$(cast keccak "$OUTPUT_CID"),$OPERATOR,$MEDIATOR,$COLLATERAL,0,$FLAGS,$TOKEN,0)"
""".strip()
STATUS = 'STATUS=$(cast call --rpc-url "$RPC" "$ESCROW" \'statusOf(bytes32)(uint8)\' "$JOB_ID")'
RELEASE = (
    'cast send --rpc-url "$RPC" --private-key "$KEY" "$ESCROW" "release(bytes32,$JOB_T)" '
    '"$JOB_ID" "$SUBMITTED_JOB"'
)
PAID = r"""
cast logs --rpc-url "$RPC" --address "$ESCROW" --from-block "$BLOCK" --json \
  'JobReleased(bytes32 indexed,address indexed,address indexed,uint96,uint96)' "$JOB_ID" \
  > released.json
read -r PAYOUT FEE < <(cast abi-decode 'f()(uint96,uint96)' \
  "$(jq -r '.[0].data' released.json)" | cut -d' ' -f1 | paste -sd' ')
""".strip()
DISPUTE = r"""
DEPOSIT=$(cast call --rpc-url "$RPC" "$ESCROW" "depositOf($JOB_T)(uint96)" "$SUBMITTED_JOB" \
  | cut -d' ' -f1)
cast send --rpc-url "$RPC" --private-key "$KEY" --value "$DEPOSIT" "$ESCROW" \
  "dispute(bytes32,$JOB_T)" "$JOB_ID" "$SUBMITTED_JOB"
""".strip()
FINALIZE = (
    'cast send --rpc-url "$RPC" --private-key "$KEY" "$ESCROW" "finalize(bytes32,$JOB_T)" '
    '"$JOB_ID" "$SUBMITTED_JOB"'
)
REFUND = (
    'cast send --rpc-url "$RPC" --private-key "$KEY" "$ESCROW" "refund(bytes32,$JOB_T)" '
    '"$JOB_ID" "$JOB"'
)
CANCEL = (
    'cast send --rpc-url "$RPC" --private-key "$KEY" "$ESCROW" "cancel(bytes32,$JOB_T)" '
    '"$JOB_ID" "$JOB"'
)
BALANCE = (
    'BALANCE=$(cast call --rpc-url "$RPC" "$ESCROW" \'balanceOf(address)(uint256)\' '
    "\"$SUBMITTER\" | cut -d' ' -f1)"
)
WITHDRAW = 'cast send --rpc-url "$RPC" --private-key "$KEY" "$ESCROW" \'withdraw()\''

COMMANDS = {
    name: value
    for name, value in globals().items()
    if name.isupper()
    and isinstance(value, str)
    and name not in {"ROOT", "DOC", "BIN", "BOUNTY", "WINDOW_OPEN", "TOO_EARLY"}
}


# ------------------------------------------------------------------ the client


class Shell:
    """A submitter's shell: a work directory, the grid's endpoints and the submitter's key in
    its environment, and the variables the doc's commands set, carried from one to the next."""

    def __init__(self, grid: LocalGrid, work: Path) -> None:
        self.work = work
        self.vars: dict[str, str] = {
            "PATH": f"{BIN}:{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(work),
            "RPC": grid.anvil.url,
            "ESCROW": grid.deployment.escrow,
            "KEY": "0x" + bytes(grid.submitters[1].key).hex(),
            "IPFS_API": grid.ipfs_daemon.api_url,
            "SCHEDULER": grid.scheduler.url,
            "FOUNDRY_DISABLE_NIGHTLY_WARNING": "1",
        }

    def run(self, *commands: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the commands in bash (``set -euo pipefail``); keep the variables they set."""
        script = "set -aeuo pipefail\n" + "\n".join(commands) + '\nenv -0 > "$VARS_OUT"\n'
        out = self.work / ".vars"
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=self.work,
            env={**self.vars, "VARS_OUT": str(out)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert proc.returncode == 0, f"{commands}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
        if proc.returncode == 0:
            self.vars = _exported(out)
        return proc

    def __getitem__(self, name: str) -> str:
        return self.vars[name]


def _exported(path: Path) -> dict[str, str]:
    """The environment ``env -0`` wrote (``set -a`` exports every variable the commands set)."""
    pairs = (item.partition("=") for item in path.read_text().split("\0") if item)
    return {name: value for name, _, value in pairs if name != "VARS_OUT"}


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGrid]:
    """One grid with two agents (WASM jobs: no Docker engine needed): the dispute's re-run
    (the mediator re-runs a disputed deterministic job) goes to the agent that did not run it."""
    try:
        cm = run_grid(
            tmp_path_factory.mktemp("outside-grid"),
            agents=2,
            with_frontend=False,
            scheduler_overrides=FAST,
            # the doc's release, dispute and in-window finalize all happen inside the window:
            # 40 s leaves room on a loaded machine (nothing here waits for it to pass)
            escrow_overrides={**FAST_ESCROW, "challenge_window": 40},
        )
        g = cm.__enter__()
    except ServiceError as exc:
        pytest.fail(f"the grid did not start: {exc}", pytrace=False)
    try:
        yield g
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def shell(grid: LocalGrid, tmp_path: Path) -> Shell:
    for tool in ("curl", "jq", "basenc", "sha256sum"):
        assert shutil.which(tool), f"{tool} is not installed"
    assert (BIN / "cast").exists(), "node_modules/.bin/cast is missing (npm ci)"
    shutil.copy(DATASET / "data.csv", tmp_path / "data.csv")
    (tmp_path / "csvstats.wasm").write_bytes(bytes(wasmtime.wat2wasm(CSVSTATS.read_text())))
    return Shell(grid, tmp_path)


def write_spec(sh: Shell, name: str) -> bytes:
    """spec.json: the canonical bytes of a csvstats job on the added module and dataset."""
    spec = JobSpec.model_validate(
        {
            "name": name,
            "executor": "wasm",
            "module_cid": sh["MODULE_CID"],
            "dataset_cid": sh["DATASET_CID"],
            "resources": SMALL,
            "limits": {"timeout_s": 60, "output_max_bytes": 1 << 20},
        }
    )
    data = spec.to_bytes()
    (sh.work / "spec.json").write_bytes(data)
    return data


def fund(sh: Shell, spec_cid: str) -> None:
    """The doc's terms, job id and createJob for ``spec_cid``; checks the id is the event's."""
    sh.vars["SPEC_CID"] = spec_cid
    sh.run(TERMS, JOB_ID, CREATE)
    assert sh["LISTED"] == "true"
    assert sh["JOB_ID"] == sh["EVENT_ID"], (sh["JOB_ID"], sh["EVENT_ID"])


def assert_reverts(proc: subprocess.CompletedProcess[str], sig: str) -> None:
    """``cast send`` failed with the escrow's custom error ``sig`` (its selector in the revert
    data: cast prints it whether or not it knows the error's name)."""
    error = sig.partition("(")[0]
    selector = "0x" + keccak(text=sig)[:4].hex()
    assert proc.returncode != 0, proc.stdout
    assert selector in proc.stderr or error in proc.stderr, (sig, selector, proc.stderr)


def submitted(sh: Shell) -> bool:
    """Whether the escrow has the job Submitted (3); an error if it is already paid."""
    sh.run(STATUS)
    assert sh["STATUS"] != "4", "paid before the submitter could accept it"
    return sh["STATUS"] == "3"


# ------------------------------------------------------------------ the tests


def test_the_doc_holds_every_command() -> None:
    doc = DOC.read_text()
    missing = [name for name, cmd in COMMANDS.items() if cmd not in doc]
    assert not missing, f"docs/protocol.md lacks the commands {missing}"


def test_funded_with_cast_in_base32_and_base58btc_and_paid(grid: LocalGrid, shell: Shell) -> None:
    sh = shell
    sh.run(ADD_MODULE, ADD_DATASET)
    module = (sh.work / "csvstats.wasm").read_bytes()
    assert sh["MODULE_CID"] == bytes_cid(module)
    assert sh["DATASET_CID"] == path_cid(DATASET)  # the directory holding data.csv

    ids: dict[str, str] = {}
    for form in ("base32", "base58btc"):
        data = write_spec(sh, f"outside-{form}")
        sh.run(ADD_SPEC, LOCAL_CID, BASE58)
        cid = sh["SPEC_CID"]
        # CIDv1, raw codec, sha2-256 of the spec's bytes: computable without IPFS
        assert cid.startswith("bafkrei") and cid == bytes_cid(data) == sh["LOCAL_CID"]
        z = sh["SPEC_CID_Z"]
        assert z.startswith("zb2") and z != cid and same_cid(z, cid)
        assert normalize_cid(z) == cid and CID.decode(z).digest == CID.decode(cid).digest
        fund(sh, cid if form == "base32" else z)
        ids[form] = sh["JOB_ID"]

        wait_for("ResultSubmitted", lambda: submitted(sh), 90, every=0.3)
        sh.run(TERMS_FROM_EVENT, JOB_T, RESULT_FROM_EVENT, 'JOB="$SUBMITTED_JOB"', IS_CURRENT)
        assert sh["CURRENT"] == "true"
        # anyone may finalize, but only once the challenge window is over
        assert_reverts(sh.run(FINALIZE, check=False), WINDOW_OPEN)
        if form == "base32":
            sh.run(RELEASE)  # the submitter accepts the result at once
        else:
            sh.run(DISPUTE, STATUS)  # the mediator re-runs the job elsewhere and upholds it
            assert sh["STATUS"] in {"6", "4"}  # Disputed, or already ruled
        view = wait_job(grid, sh["JOB_ID"], {"released"}, 90)
        assert same_cid(view["spec_cid"], cid) and view["spec"]["name"] == f"outside-{form}"
        sh.run(FOLLOW)
        sh.run(PAID, TERMS_FROM_EVENT)
        fee = BOUNTY * int(sh["FEE_BPS"]) // 10_000
        assert (int(sh["PAYOUT"]), int(sh["FEE"])) == (BOUNTY - fee, fee)
        paid = [
            e
            for e in grid.escrow.events(int(sh["BLOCK"]))
            if e.name == "JobReleased" and "0x" + bytes(e.args["jobId"]).hex() == sh["JOB_ID"]
        ]
        assert len(paid) == 1, paid
        if form == "base58btc":  # disputed, then upheld by the mediator
            events = {
                e.name: e
                for e in grid.escrow.events(int(sh["BLOCK"]))
                if "0x" + bytes(e.args.get("jobId", b"")).hex() == sh["JOB_ID"]
            }
            assert "ResultDisputed" in events and events["Ruled"].args["upheld"] is True
            # upheld on the re-run's output, not on integrity alone
            reruns = [
                e
                for e in grid.escrow.events(int(sh["BLOCK"]))
                if e.name == "JobCreated" and e.args["submitter"] == grid.mediator.address
            ]
            assert reruns, "the mediator did not re-run the disputed job"
        assert paid[0].args["provider"] in {a.account.address for a in grid.agents}
        assert int(paid[0].args["payout"]) == BOUNTY - fee and fee > 0
    assert ids["base32"] != ids["base58btc"]  # keccak256(bytes(specCid)): the text counts


def test_spec_that_does_not_hash_to_its_cid_is_invalid_and_cancelled(
    grid: LocalGrid, shell: Shell
) -> None:
    sh = shell
    sh.run(ADD_MODULE, ADD_DATASET)
    data = write_spec(sh, "outside-chunked")
    assert len(data) > 64
    sh.run(ADD_CHUNKED)
    bad = sh["BAD_CID"]
    # a dag-pb tree of 64-byte chunks: IPFS serves the spec, but not as the CID of its bytes
    assert normalize_cid(bad).startswith("bafybei") and not same_cid(bad, bytes_cid(data))
    fund(sh, bad)
    view = wait_job(grid, sh["JOB_ID"], {"invalid"}, 60)
    assert "do not hash" in view["reason"], view["reason"]
    follow = sh.run(FOLLOW).stdout
    assert follow.startswith("invalid: ") and "do not hash" in follow, follow

    sh.run(BALANCE)
    before = int(sh["BALANCE"])
    sh.run(TERMS_FROM_EVENT, JOB_T, FUNDED_JOB, IS_CURRENT)
    assert sh["CURRENT"] == "true"
    assert_reverts(sh.run(REFUND, check=False), TOO_EARLY)
    sh.run(CANCEL, BALANCE)
    assert int(sh["BALANCE"]) == before + BOUNTY
    # the scheduler folds the JobRefunded event (wait_job would stop at the final ``invalid``)
    wait_for(
        "the scheduler to see the refund",
        lambda: (job_view(grid, sh["JOB_ID"]) or {}).get("chain_status") == "refunded",
        30,
    )

    assert sh["SUBMITTER"] == grid.submitters[1].address
    wallet = int(grid.w3.eth.get_balance(grid.submitters[1].address))
    sh.run(WITHDRAW, BALANCE)
    assert sh["BALANCE"] == "0"
    gained = int(grid.w3.eth.get_balance(grid.submitters[1].address)) - wallet
    assert before + BOUNTY - 10**15 < gained <= before + BOUNTY  # less the gas


def test_a_replicated_job_funded_with_cast_names_its_group_and_seats(
    grid: LocalGrid, shell: Shell
) -> None:
    """Section 7: ``createJob`` with ``replicas`` 3 funds three seats; the group id computed
    with ``cast`` is the ``ReplicasCreated`` event's, and the seats' ids are
    ``keccak256(abi.encode(groupId, i))``, in order, each with a third of the value."""
    sh = shell
    sh.run(ADD_MODULE, ADD_DATASET)
    write_spec(sh, "outside-replicated")
    sh.run(ADD_SPEC, TERMS, CREATED_EVENT, REPLICATE, SEATS)
    seats = sh["SEATS"].split()
    group = bytes.fromhex(sh["GROUP_ID"][2:])
    assert seats == ["0x" + s.hex() for s in seat_ids(group, 3)]
    assert seats[0] == sh["SEAT_0"]
    events = [e for e in grid.escrow.events(grid.escrow.deployment.block) if e.args]
    (created,) = [
        e for e in events if e.name == "ReplicasCreated" and bytes(e.args["groupId"]) == group
    ]
    assert created.args["replicas"] == 3 and created.args["submitter"] == sh["SUBMITTER"]
    bounties = [
        int(e.args["bounty"])
        for e in events
        if e.name == "JobCreated" and "0x" + bytes(e.args["jobId"]).hex() in seats
    ]
    assert bounties == [BOUNTY, BOUNTY, BOUNTY]
