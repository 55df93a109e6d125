"""The ``gridmarket-agent`` CLI, the keystore and the configuration, on this CPU-only machine.

Commands run in-process (typer's runner) and, where exit codes and stderr matter, as a real
``python -m agent.cli`` process.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from typer.testing import CliRunner

from agent.cli import _command, run_parser
from agent.commands import app
from agent.config import ConfigError, load_config, multiaddr_to_url
from devstack.dockerd import Dockerd
from gridmarket.keystore import KeystoreError, create_keystore, keystore_address, load_account

ROOT = Path(__file__).resolve().parents[2]
KEY = "0x" + "3c" * 32


@pytest.fixture(autouse=True)
def _keep_root_logging() -> Iterator[None]:
    """In-process commands configure logging on the runner's stderr; restore it afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m agent.cli ARGS`` in a clean environment (no GRIDMARKET_AGENT_* leaks in)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")}
    base.pop("DOCKER_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


# --------------------------------------------------------------------------- keystore


def test_keystore_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "keystore.json"
    address = create_keystore(path, "s3cret", private_key=KEY, iterations=2**10)
    assert address == Account.from_key(KEY).address
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_account(path, "s3cret").key.hex().removeprefix("0x") == KEY[2:]
    assert keystore_address(path) == address  # readable without the password
    with pytest.raises(KeystoreError, match="wrong password"):
        load_account(path, "guess")


def test_keystore_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "keystore.json"
    first = create_keystore(path, "pw", iterations=2**10)
    with pytest.raises(KeystoreError, match="refusing to overwrite"):
        create_keystore(path, "pw", private_key=KEY, iterations=2**10)
    assert keystore_address(path) == first  # untouched
    assert create_keystore(path, "pw", private_key=KEY, force=True, iterations=2**10) != first


def test_keystore_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(KeystoreError, match="gridmarket-agent init"):
        load_account(tmp_path / "absent.json", "pw")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(KeystoreError, match="not an Ethereum keystore"):
        load_account(tmp_path / "bad.json", "pw")
    with pytest.raises(KeystoreError, match="not be empty"):
        create_keystore(tmp_path / "k.json", "")
    with pytest.raises(KeystoreError, match="not a valid private key"):
        create_keystore(tmp_path / "k.json", "pw", private_key="0x1234")


def test_init_creates_then_refuses_then_forces(tmp_path: Path) -> None:
    keystore = tmp_path / "ks.json"
    env = {"GRIDMARKET_AGENT_PASSWORD": "pw", "GRIDMARKET_AGENT_KEYSTORE": str(keystore)}
    made = cli("init", env=env)
    assert made.returncode == 0, made.stderr
    assert "created wallet 0x" in made.stdout
    assert stat.S_IMODE(keystore.stat().st_mode) == 0o600
    address = keystore_address(keystore)

    again = cli("init", env=env)
    assert again.returncode == 1
    assert again.stderr.strip().startswith("error: ") and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert keystore_address(keystore) == address

    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    forced = cli("init", "--force", "--private-key-file", str(key_file), env=env)
    assert forced.returncode == 0, forced.stderr
    assert f"imported wallet {Account.from_key(KEY).address}" in forced.stdout
    assert load_account(keystore, "pw").address == Account.from_key(KEY).address


def test_init_without_a_password_fails_clearly(tmp_path: Path) -> None:
    done = cli("init", "--keystore", str(tmp_path / "k.json"))
    assert done.returncode == 1
    assert "GRIDMARKET_AGENT_PASSWORD" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- detect


def test_detect_json_on_this_cpu_only_machine(tmp_path: Path) -> None:
    done = cli("detect", "--json", "--work-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["gpus"] == [] and report["gpu_source"] == "none"
    assert "reporting CPU-only" in report["gpu_detection"]
    assert report["node_tier"] == "cpu" and report["tier_guessed"] is False
    assert report["cpu_logical_cores"] >= 1 and report["ram_mib"] > 0
    assert report["disk_free_mib"] > 0 and report["work_dir"] == str(tmp_path)
    assert report["executors"] == ["wasm"]  # no engine at the default socket here
    assert report["executor_notes"][0].startswith("docker unavailable")


def test_detect_sees_a_running_docker_engine(dockerd: Dockerd) -> None:
    done = cli("detect", "--json", env={"DOCKER_HOST": dockerd.host})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["executors"] == ["docker", "wasm"] and report["executor_notes"] == []


def test_detect_plain_text_when_not_a_terminal() -> None:
    result = CliRunner().invoke(app, ["detect"])
    assert result.exit_code == 0, result.output
    assert "gpus: none (CPU-only)" in result.output and "node tier: cpu" in result.output


# --------------------------------------------------------------------------- config


def test_config_file_env_and_flags_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text(
        'scheduler_url = "http://sched.example:8700/"\nslots = 2\nregion = "eu-west"\n'
        'executors = ["wasm"]\nwork-dir = "~/gm-work"\n'
    )
    monkeypatch.setenv("GRIDMARKET_AGENT_SLOTS", "3")
    config = load_config(toml, region="us")
    assert config.scheduler_url == "http://sched.example:8700"  # trailing slash dropped
    assert config.slots == 3  # env beats file
    assert config.region == "us"  # flag beats env and file
    assert config.executors == ["wasm"]
    assert config.work_dir == Path("~/gm-work").expanduser()
    yaml_file = tmp_path / "agent.yaml"
    yaml_file.write_text("region: jp\nprice_floor_wei_per_hour: 1000\n")
    assert load_config(yaml_file).price_floor_wei_per_hour == 1000


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text('schedular_url = "http://x"\n')
    with pytest.raises(ConfigError, match=r"unknown setting.*schedular_url"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"region.*unknown region 'mars'"):
        load_config(region="mars")
    with pytest.raises(ConfigError, match="scheduler_url"):
        load_config(scheduler_url="ftp://x")
    with pytest.raises(ConfigError, match="region is not set"):
        load_config().require_region()


def test_config_acceptance_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mediator = "0x" + "ab" * 20
    toml = tmp_path / "agent.toml"
    toml.write_text(f'accepted_mediators = ["{mediator}"]\nmax_collateral_wei = 5\n')
    config = load_config(toml)
    assert config.accepted_mediators == ["0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"]  # EIP-55
    assert config.max_collateral_wei == 5 and not config.accept_self_mediated
    assert config.guard_results and config.guard_delay_s is None
    monkeypatch.setenv("GRIDMARKET_AGENT_ACCEPT_SELF_MEDIATED", "true")
    monkeypatch.setenv("GRIDMARKET_AGENT_ACCEPTED_MEDIATORS", "[]")
    config = load_config(toml)
    assert config.accept_self_mediated and config.accepted_mediators == []
    with pytest.raises(ConfigError, match=r"accepted_mediators.*not a 0x address"):
        load_config(accepted_mediators=["0x12"])
    with pytest.raises(ConfigError, match="max_collateral_wei"):
        load_config(max_collateral_wei=-1)


TUSD = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"


def deployment_with_tusd(tmp_path: Path) -> Path:
    """A deployment file listing tUSD (6 decimals), as `gridmarket-deploy --test-token` writes."""
    path = tmp_path / "deployment.json"
    body = {
        "chain_id": 31337,
        "escrow": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
        "block": 1,
        "abi": [],
        "params": {},
        "tokens": {"tUSD": {"address": TUSD, "decimals": 6, "minBounty": 10_000}},
    }
    path.write_text(json.dumps(body))
    return path


def test_config_token_floors_and_stakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = deployment_with_tusd(tmp_path)
    yaml_file = tmp_path / "agent.yaml"
    yaml_file.write_text(
        f"deployment: {deployment}\nprice_floors: {{tUSD: '0.50'}}\nstake-tokens: {{tUSD: '100'}}\n"
    )
    config = load_config(yaml_file)
    assert config.token_floors == {TUSD: 500_000}  # smallest units per hour
    assert config.token_stakes == {TUSD: 100 * 10**6}
    assert config.token(TUSD).symbol == "tUSD" and config.token("0x" + "00" * 20).symbol == "ETH"
    # TOML, a YAML number, the address in any case, the symbol in any case
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'deployment = "{deployment}"\n[price_floors]\n"{TUSD.lower()}" = "0.000001"\n'
        "[stake_tokens]\ntusd = 7\n"
    )
    config = load_config(toml)
    assert config.token_floors == {TUSD: 1} and config.token_stakes == {TUSD: 7 * 10**6}
    yaml_file.write_text(f"deployment: {deployment}\nprice_floors: {{tUSD: 0.1}}\n")
    assert load_config(yaml_file).token_floors == {TUSD: 100_000}
    # the environment, as JSON
    monkeypatch.setenv("GRIDMARKET_AGENT_PRICE_FLOORS", '{"tUSD": "2"}')
    assert load_config(yaml_file).token_floors == {TUSD: 2 * 10**6}
    monkeypatch.delenv("GRIDMARKET_AGENT_PRICE_FLOORS")
    # none set: nothing resolved, no deployment needed
    assert load_config().token_floors == {} and load_config().tokens == {}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"price_floors": {"USDC": "1"}}, r"price_floors\.USDC: not a token the deployment lists"),
        ({"price_floors": {"tUSD": "abc"}}, r"price_floors\.tUSD: Input should be a valid decimal"),
        ({"price_floors": {"tUSD": "0.0000001"}}, r"price_floors\.tUSD: .*more than 6 decimals"),
        ({"price_floors": {"tUSD": "-1"}}, r"price_floors\.tUSD: '-1' is not an amount of tUSD"),
        ({"price_floors": {"tUSD": "nan"}}, r"price_floors\.tUSD: Input should be a finite"),
        ({"price_floors": {"ETH": "1"}}, r"price_floors\.ETH: .*use price_floor_wei_per_hour"),
        ({"stake_tokens": {"tUSD": "1e40"}}, r"stake_tokens\.tUSD: .* is too large"),
        ({"price_floors": {"tUSD": "1e300000"}}, r"price_floors\.tUSD: '1e300000' is too large"),
        ({"stake_tokens": {"tUSD": "9" * 5000}}, r"stake_tokens\.tUSD: .*too long"),
        ({"price_floors": {"tUSD": "1e-999999999"}}, r"price_floors\.tUSD: .*more than 6 decimals"),
        ({"stake_tokens": {"0x" + "12" * 20: "1"}}, r"stake_tokens\.0x1212.*not a token"),
        ({"stake_tokens": {"ETH": "1"}}, r"stake_tokens\.ETH: .*register --stake"),
        (
            {"stake_tokens": {"tUSD": "1", "tusd": "2"}},
            r"stake_tokens\.tusd: tUSD is named twice",
        ),
    ],
)
def test_config_token_errors_name_the_key(
    tmp_path: Path, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(deployment=deployment_with_tusd(tmp_path), **settings)


def test_config_tokens_need_the_deployment(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="price_floors name tokens: set deployment"):
        load_config(price_floors={"tUSD": "1"})
    with pytest.raises(ConfigError, match=r"deployment .*missing.json: No such file"):
        load_config(deployment=tmp_path / "missing.json", stake_tokens={"tUSD": "1"})
    broken = tmp_path / "broken.json"
    broken.write_text('{"tokens": {"tUSD": {"address": "0x12"}}}')
    with pytest.raises(ConfigError, match="unreadable tokens"):
        load_config(deployment=broken, stake_tokens={"tUSD": "1"})
    too_many = {f"0x{i:040x}": "1" for i in range(1, 10)}
    with pytest.raises(ConfigError, match="price_floors"):
        load_config(deployment=deployment_with_tusd(tmp_path), price_floors=too_many)


def test_capacity_sends_the_token_floors(tmp_path: Path) -> None:
    """The registration's capacity: ETH's floor as before, each token's in smallest units per
    hour under its address (NodeCapacityIn.price_floors)."""
    from agent.capacity import node_capacity
    from agent.hardware import detect_hardware
    from gridmarket.wire import ExecutorKind, NodeCapacityIn

    config = load_config(
        deployment=deployment_with_tusd(tmp_path),
        price_floors={"tUSD": "0.25"},
        price_floor_wei_per_hour=7,
        region="us",
        work_dir=tmp_path / "work",
    )
    capacity = node_capacity(config, detect_hardware(tmp_path), [ExecutorKind.WASM])()
    assert capacity.price_floors == {TUSD: 250_000}
    assert capacity.price_floor_wei_per_hour == 7
    wire = capacity.model_dump(mode="json")
    assert NodeCapacityIn.model_validate(wire).price_floors == {TUSD: 250_000}
    plain = node_capacity(load_config(region="us"), detect_hardware(tmp_path), ["wasm"])()
    assert plain.price_floors == {}


def test_config_password_from_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\nignored\n")
    assert load_config(password_file=secret).read_password() == "from-file"
    assert load_config(password="direct", password_file=secret).read_password() == "direct"


def test_multiaddr_to_url() -> None:
    assert multiaddr_to_url("/ip4/127.0.0.1/tcp/5001/http") == "http://127.0.0.1:5001"
    assert multiaddr_to_url("/dns/ipfs.local/tcp/443/https") == "https://ipfs.local:443"
    assert multiaddr_to_url("/ip6/::1/tcp/5001") == "http://[::1]:5001"
    for bad in ("/ip4/1.2.3.4/udp/1/http", "/ip4/1.2.3.4/tcp/x/http", "http://x"):
        with pytest.raises(ValueError):
            multiaddr_to_url(bad)


# --------------------------------------------------------------------------- errors


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text("slots = [")
    for args, expected in [
        (("--config", str(bad), "detect"), "not valid TOML"),
        (("status", "--scheduler-url", "http://127.0.0.1:9"), "has not registered yet"),
        (("register", "--region", "us"), "no keystore at"),
        (("run", "--region", "us"), "no keystore at"),  # the lean entry, no typer
        (("--config", str(bad), "run"), "not valid TOML"),
    ]:
        env = {"GRIDMARKET_AGENT_WORK_DIR": str(tmp_path), "GRIDMARKET_AGENT_PASSWORD": "pw"}
        env["GRIDMARKET_AGENT_KEYSTORE"] = str(tmp_path / "none.json")
        done = cli(*args, env=env)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


# --------------------------------------------------------------------------- the lean entry


def test_the_command_word_is_found_after_the_root_options() -> None:
    assert _command(["run"]) == "run"
    assert _command(["--config", "a.toml", "-v", "run", "--slots", "2"]) == "run"
    assert _command(["-c", "a.toml", "--verbose", "run"]) == "run"
    assert _command(["--config=a.toml", "run"]) == "run"
    assert _command(["-v", "detect", "run"]) == "detect"
    assert _command(["--help"]) == "--help"
    assert _command(["--config"]) is None
    assert _command([]) is None


def test_lean_run_takes_the_typer_options() -> None:
    """``run`` is parsed twice (argparse in agent.cli, typer in agent.commands): the same
    option names, root and ``run``, so neither can drift from the other."""
    import typer.main

    group = typer.main.get_command(app)
    typer_run = group.commands["run"]  # type: ignore[attr-defined]

    def typer_options(params: list) -> set[str]:
        return {o for p in params for o in [*p.opts, *p.secondary_opts] if o.startswith("-")}

    parser = run_parser()
    lean_root = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    subparsers = next(a for a in parser._actions if a.dest == "command")
    lean_run = {o for a in subparsers.choices["run"]._actions for o in a.option_strings} - {
        "-h",
        "--help",
    }
    assert lean_root == typer_options(group.params) - {"--help"}
    assert lean_run == typer_options(typer_run.params) - {"--help"}

    args = "-c x.yaml -v run --slots 3 --accept-mediator 0xa --accept-mediator 0xb"
    ns = parser.parse_args([*args.split(), "--refuse-self-mediated", "--max-collateral-wei", "5"])
    assert (ns.config, ns.verbose, ns.slots) == (Path("x.yaml"), True, 3)
    assert ns.accept_mediator == ["0xa", "0xb"]
    assert (ns.accept_self_mediated, ns.max_collateral_wei) == (False, 5)
    assert parser.parse_args(["run"]).accept_self_mediated is None
    assert parser.parse_args(["run", "--accept-self-mediated"]).accept_self_mediated is True


def test_lean_run_help_and_bad_options() -> None:
    done = cli("run", "--help")
    assert done.returncode == 0 and "--accept-self-mediated" in done.stdout
    assert "SIGTERM" in done.stdout
    done = cli("run", "--slots", "many")
    assert done.returncode == 2 and "--slots" in done.stderr
    done = cli("--help")  # the typer app lists every command
    assert done.returncode == 0 and "run" in done.stdout and "withdraw" in done.stdout


HEAVY = (
    "eth_account",
    "eth_utils",
    "eth_abi",
    "eth_keys",
    "eth_typing",
    "web3",
    "cytoolz",
    "hexbytes",
    "typer",
    "click",
    "rich",
    "pygments",
    "docker",
    "requests",
    "trio",
)
"""What the idle daemon without rpc_url must not load (docs/agent.md, "Footprint")."""

PROBE = """
import json, os, sys, threading, time
from agent.cli import main
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.escrow import Job
from gridmarket.ethsig import KeyAccount

def probe():
    time.sleep(float(sys.argv[2]))
    signer = KeyAccount(bytes(range(1, 33)))  # the signatures the daemon makes, made here
    job = Job(submitter="0x" + "0" * 40, bounty=1)
    sign_acceptance(signer, 1, "0x" + "1" * 40, bytes(32), 1, job, 900)
    sign_result(signer, 1, "0x" + "1" * 40, bytes(32), 1, "bafy")
    loaded = sorted(m for m, module in sys.modules.items() if module is not None)
    print("MODULES " + json.dumps(loaded), flush=True)
    os._exit(0)

threading.Thread(target=probe, daemon=True).start()
main(["--config", sys.argv[1], "run"])
"""


def test_the_daemon_without_rpc_url_loads_no_heavy_module(tmp_path: Path) -> None:
    """The run path as ``make up`` takes it (keystore, Docker and WASM executors, no rpc_url):
    the daemon starts, tries to register with a scheduler that is not there, and has loaded
    none of :data:`HEAVY` nor httpx's command line (a regression would put MBs back)."""
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=KEY, kdf="pbkdf2", iterations=10)
    settings = tmp_path / "agent.yaml"
    settings.write_text(
        json.dumps(
            {
                "scheduler_url": "http://127.0.0.1:9",
                "ipfs_api": "/ip4/127.0.0.1/tcp/9/http",
                "keystore": str(keystore),
                "password": "pw",
                "region": "eu-west",
                "work_dir": str(tmp_path / "work"),
                "executors": ["docker", "wasm"],
                "docker_host": f"unix://{tmp_path}/no-docker.sock",
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(settings), "4"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")},
        timeout=60,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, (done.stdout, done.stderr)
    modules = set(json.loads(line.removeprefix("MODULES ")))
    assert "agent.daemon" in modules and "coincurve" in modules
    assert "registration" in done.stderr  # it got as far as trying to register
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY or m == "httpx._main")
    assert loaded == []
    from agent.hardware import _nvml_library_loads

    if not _nvml_library_loads():  # no NVIDIA driver here: pynvml is not even imported
        assert "pynvml" not in modules
