"""JobRunner end to end on the real js-ipfs daemon and dockerd: assignment in, signed report out.

The happy paths check what the scheduler and the escrow will check: the output CID recomputes
from the produced bytes (:func:`gridmarket.cid.path_cid`), the bytes come back from IPFS, and the
EIP-712 signature recovers to the node's wallet. The failure paths check each reason the wire
knows, and that no job directory is left behind.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Any

import docker
import ipfshttpclient
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from agent.config import multiaddr_to_url
from agent.executors.docker import DockerExecutor
from agent.executors.wasm import WasmExecutor
from agent.runner import IpfsProbe, JobRunner, decode_tail, limits_for
from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon
from gridmarket.cid import bytes_cid, path_cid
from gridmarket.eip712 import recover_result_signer
from gridmarket.wire import (
    MAX_LOG_CHARS,
    Assignment,
    ExecutorKind,
    JobSpec,
    JobTerms,
    RunReason,
)
from tests.agent import wat

MiB = 1024 * 1024
CHAIN_ID = 31337
ESCROW = Account.from_key("0x" + "42" * 32).address


@pytest.fixture
def dataset_cid(storage: AgentIpfsStore, tmp_path: Path) -> str:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "data.txt").write_text("hello gridmarket\n")
    return storage.add_dir(data)


def assignment(spec: JobSpec, attempt: int = 1) -> Assignment:
    now = time.time()
    return Assignment(
        job_id="0x" + secrets.token_hex(32),
        attempt=attempt,
        spec_cid=bytes_cid(spec.to_bytes()),
        spec=spec,
        bounty_wei=10**16,
        deadline=int(now) + 3600,
        lease_expires_at=now + 30,
        chain_id=CHAIN_ID,
        escrow=ESCROW,
        terms=JobTerms(
            bounty_wei=10**16,
            fee_bps=250,
            deadline=int(now) + 3600,
            collateral_wei=10**16,
            mediator="0x" + "0a" * 20,
            flags=0,
            operator="0x" + "01" * 20,
            hold_for=900,
        ),
    )


def docker_spec(image: str, script: str, **fields: Any) -> JobSpec:
    return JobSpec(
        executor=ExecutorKind.DOCKER, image=image, command=["/bin/sh", "-c", script], **fields
    )


def assert_no_job_dirs(runner: JobRunner) -> None:
    assert not runner.jobs_dir.exists() or not any(runner.jobs_dir.iterdir())


def expected_cid(tmp_path: Path, files: dict[str, bytes]) -> str:
    """The CID of a directory holding ``files``: what the job should have produced."""
    folder = tmp_path / f"expected-{secrets.token_hex(4)}" / "output"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return path_cid(folder)


# --------------------------------------------------------------------------- happy paths


def test_docker_job_with_dataset_is_uploaded_and_signed(
    runner: JobRunner,
    account: LocalAccount,
    test_image: str,
    dataset_cid: str,
    storage: AgentIpfsStore,
    tmp_path: Path,
) -> None:
    spec = docker_spec(
        test_image,
        "set -e; tr a-z A-Z < /input/data.txt > /output/upper.txt; echo done; echo note >&2",
        dataset_cid=dataset_cid,
    )
    job = assignment(spec, attempt=2)
    report = runner.run(job)

    assert report.reason is RunReason.SUCCEEDED, report
    assert report.exit_code == 0 and report.attempt == 2
    # log tails are kept as written (the wire strips other strings, not these)
    assert report.stdout_tail == "done\n" and report.stderr_tail == "note\n"
    assert report.output_bytes == len(b"HELLO GRIDMARKET\n")
    assert report.output_cid == expected_cid(tmp_path, {"upper.txt": b"HELLO GRIDMARKET\n"})
    back = tmp_path / "fetched"
    storage.fetch(report.output_cid, back, max_bytes=MiB)  # what the scheduler will do
    assert (back / "upper.txt").read_bytes() == b"HELLO GRIDMARKET\n"
    assert path_cid(back) == report.output_cid
    assert report.signature is not None
    signer = recover_result_signer(
        bytes.fromhex(report.signature[2:]),
        CHAIN_ID,
        ESCROW,
        bytes.fromhex(job.job_id[2:]),
        2,
        report.output_cid,
    )
    assert signer == account.address
    assert_no_job_dirs(runner)


def test_wasm_job_whose_module_comes_from_ipfs(
    runner: JobRunner,
    account: LocalAccount,
    dataset_cid: str,
    ipfs_client: ipfshttpclient.Client,
    tmp_path: Path,
) -> None:
    module = wat.build(wat.UPPERCASE, tmp_path / "upper.wasm")
    module_cid = ipfs_client.add(str(module), cid_version=1, raw_leaves=True)["Hash"]
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=module_cid, dataset_cid=dataset_cid)
    job = assignment(spec)
    report = runner.run(job)

    assert report.reason is RunReason.SUCCEEDED, report
    assert report.stdout_tail == "ok\n"
    assert report.output_cid == expected_cid(tmp_path, {"upper.txt": b"HELLO GRIDMARKET\n"})
    assert report.signature is not None
    signer = recover_result_signer(
        bytes.fromhex(report.signature[2:]),
        CHAIN_ID,
        ESCROW,
        bytes.fromhex(job.job_id[2:]),
        1,
        report.output_cid,
    )
    assert signer == account.address
    assert_no_job_dirs(runner)


def test_job_without_dataset_and_empty_output(runner: JobRunner, test_image: str) -> None:
    report = runner.run(assignment(docker_spec(test_image, "echo nothing to write")))
    assert report.reason is RunReason.SUCCEEDED, report
    assert report.output_bytes == 0 and report.output_cid is not None


# --------------------------------------------------------------------------- failures


def test_missing_image_is_a_workload_error(runner: JobRunner) -> None:
    report = runner.run(assignment(docker_spec("gridmarket/absent:1", "true")))
    assert report.reason is RunReason.WORKLOAD_ERROR
    assert "gridmarket/absent:1" in report.message and "never pulled" in report.message
    assert report.output_cid is None and report.signature is None
    assert_no_job_dirs(runner)


def test_dataset_that_cannot_be_found_is_a_dataset_error(
    runner: JobRunner, test_image: str
) -> None:
    missing = bytes_cid(secrets.token_bytes(64))  # well-formed, on no IPFS node
    report = runner.run(assignment(docker_spec(test_image, "true", dataset_cid=missing)))
    assert report.reason is RunReason.DATASET_ERROR, report
    assert missing in report.message
    assert_no_job_dirs(runner)


def test_dataset_over_the_jobs_cap_is_a_dataset_error(
    runner: JobRunner, test_image: str, dataset_cid: str
) -> None:
    spec = docker_spec(test_image, "true", dataset_cid=dataset_cid, limits={"dataset_max_bytes": 4})
    report = runner.run(assignment(spec))
    assert report.reason is RunReason.DATASET_ERROR
    assert "cap" in report.message


def test_node_cap_on_datasets_applies_too(
    runner: JobRunner, test_image: str, dataset_cid: str
) -> None:
    runner.max_dataset_bytes = 4
    report = runner.run(assignment(docker_spec(test_image, "true", dataset_cid=dataset_cid)))
    assert report.reason is RunReason.DATASET_ERROR


def test_timeout(runner: JobRunner, test_image: str) -> None:
    started = time.monotonic()
    report = runner.run(assignment(docker_spec(test_image, "sleep 30", limits={"timeout_s": 1})))
    assert report.reason is RunReason.TIMEOUT, report
    assert report.exit_code is None and report.output_cid is None
    assert time.monotonic() - started < 15
    assert_no_job_dirs(runner)


def test_exit_code_keeps_the_log_tails(runner: JobRunner, test_image: str) -> None:
    script = "printf 'bad \\377 byte\\n'; echo failing >&2; exit 3"
    report = runner.run(assignment(docker_spec(test_image, script)))
    assert report.reason is RunReason.EXIT_CODE and report.exit_code == 3
    assert report.stdout_tail == "bad \ufffd byte\n"  # invalid UTF-8 replaced, not an error
    assert report.stderr_tail == "failing\n"


def test_cancel_stops_a_running_job(runner: JobRunner, test_image: str) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    report = runner.run(assignment(docker_spec(test_image, "sleep 30")), cancel)
    assert report.reason is RunReason.CANCELLED
    assert_no_job_dirs(runner)


def test_cancel_before_the_run(runner: JobRunner, test_image: str) -> None:
    cancel = threading.Event()
    cancel.set()
    report = runner.run(assignment(docker_spec(test_image, "true")), cancel)
    assert report.reason is RunReason.CANCELLED


def test_module_cid_naming_a_directory_is_a_workload_error(
    runner: JobRunner, dataset_cid: str
) -> None:
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=dataset_cid)
    report = runner.run(assignment(spec))
    assert report.reason is RunReason.WORKLOAD_ERROR
    assert "single .wasm file" in report.message


def test_invalid_module_is_a_workload_error(
    runner: JobRunner, ipfs_client: ipfshttpclient.Client, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"\0asm but not really")
    cid = ipfs_client.add(str(junk), cid_version=1, raw_leaves=True)["Hash"]
    report = runner.run(assignment(JobSpec(executor=ExecutorKind.WASM, module_cid=cid)))
    assert report.reason is RunReason.WORKLOAD_ERROR
    assert "not a valid WASM module" in report.message


def test_executor_this_node_does_not_serve(
    account: LocalAccount, ipfs_daemon: IpfsDaemon, tmp_path: Path
) -> None:
    wasm_only = JobRunner(
        account,
        storage=lambda: AgentIpfsStore(ipfs_daemon.api_addr),
        executors={ExecutorKind.WASM: WasmExecutor},
        work_dir=tmp_path,
    )
    report = wasm_only.run(assignment(docker_spec("busybox", "true")))
    assert report.reason is RunReason.WORKLOAD_ERROR
    assert "does not run docker jobs" in report.message


def test_ipfs_daemon_down_is_an_agent_error(
    account: LocalAccount, test_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    dead = "/ip4/127.0.0.1/tcp/9/http"  # discard port: nothing listens
    runner = JobRunner(
        account,
        storage=lambda: AgentIpfsStore(dead, timeout=2),
        executors={ExecutorKind.DOCKER: lambda: DockerExecutor(docker_client)},
        work_dir=tmp_path,
        storage_alive=IpfsProbe(multiaddr_to_url(dead), timeout_s=1),
        storage_wait_s=1.5,
    )
    cid = bytes_cid(b"anything")
    report = runner.run(assignment(docker_spec(test_image, "true", dataset_cid=cid)))
    assert report.reason is RunReason.AGENT_ERROR
    assert "IPFS daemon is down" in report.message


def test_clean_leftovers(runner: JobRunner) -> None:
    stale = runner.jobs_dir / "deadbeef-1" / "input"
    stale.mkdir(parents=True)
    (stale / "x").write_text("left by a crash")
    assert runner.clean_leftovers() == 1
    assert not any(runner.jobs_dir.iterdir())


# --------------------------------------------------------------------------- pure helpers


def test_limits_follow_the_spec() -> None:
    spec = JobSpec(
        executor=ExecutorKind.DOCKER,
        image="busybox",
        resources={"cpu_cores": 3, "ram_mib": 768, "gpu_count": 1},
        limits={"timeout_s": 42, "output_max_bytes": 5000, "pids": 99},
    )
    limits = limits_for(spec)
    assert limits.memory_bytes == 768 * MiB and limits.cpus == 3.0 and limits.gpus == 1
    assert limits.timeout_s == 42 and limits.output_bytes == 5000 and limits.pids == 99
    assert limits.log_bytes == MAX_LOG_CHARS


def test_decode_tail_keeps_the_end_and_replaces_bad_bytes() -> None:
    assert decode_tail(b"ab\xffc") == "ab\ufffdc"
    assert decode_tail(b"x" * 10 + b"yz", limit=2) == "yz"
    assert decode_tail("é".encode() * MAX_LOG_CHARS) == "é" * MAX_LOG_CHARS
