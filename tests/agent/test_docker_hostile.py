"""Hostile jobs against the Docker sandbox: each is contained and reported with a clear reason.

After every test a canary job must still succeed, no container may be left behind and no
loop-mounted /output may stay mounted.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from agent.executors import ExecutionResult, ExecutionSpec, Limits, OutputMode, Reason
from agent.executors.docker import LABEL, DockerExecutor
from devstack.dockerd import Dockerd

KiB, MiB = 1024, 1024 * 1024


def run(
    executor: DockerExecutor, image: str, script: str, job: tuple[Path, Path], **limits: object
) -> ExecutionResult:
    spec = ExecutionSpec(image=image, command=("/bin/sh", "-c", script), limits=Limits(**limits))  # type: ignore[arg-type]
    return executor.run(spec, *job)


@pytest.fixture(autouse=True)
def executor_survives(
    docker_executor: DockerExecutor,
    docker_client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
) -> Iterator[None]:
    yield
    canary = run(
        docker_executor, test_image, "echo alive > /output/ok", (tmp_path, tmp_path / "canary")
    )
    assert canary.ok, canary
    assert docker_client.containers.list(all=True, filters={"label": LABEL}) == []
    with open("/proc/self/mounts") as mounts:
        assert str(tmp_path) not in mounts.read()


def _host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def test_no_network(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)  # noqa: S104
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        script = (
            "ls /sys/class/net; "
            f"for ip in {_host_ip()} 127.0.0.1 1.1.1.1; do "
            f"wget -q -T 2 -O - http://$ip:{port}/leak && echo REACHED $ip; done; "
            "nslookup example.com >/dev/null 2>&1 && echo REACHED dns; exit 1"
        )
        result = run(docker_executor, test_image, script, job, timeout_s=20)
    finally:
        server.shutdown()
    assert hits == []
    assert b"REACHED" not in result.stdout
    assert result.stdout.split() == [b"lo"]  # the only interface
    assert result.reason is Reason.EXIT_CODE


def test_fork_bomb_hits_the_pids_limit(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    result = run(
        docker_executor,
        test_image,
        "bomb() { while :; do bomb & done; }; bomb",
        job,
        pids=48,
        cpus=0.5,
        timeout_s=3,
    )
    # The shell that cannot fork gives up (exit 2), or the deadline kills the lot.
    assert result.reason in (Reason.EXIT_CODE, Reason.TIMEOUT), result
    assert b"can't fork" in result.stderr
    assert result.duration_s < 15


def test_memory_bomb_is_oom_killed(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    result = run(
        docker_executor,
        test_image,
        "x=0123456789abcdef; while :; do x=$x$x; done",
        job,
        memory_bytes=32 * MiB,
        timeout_s=30,
    )
    assert result.reason is Reason.OUT_OF_MEMORY, result
    assert result.oom_killed and result.exit_code == 137
    assert "memory limit" in result.message


def test_tmp_is_memory_bounded_too(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    result = run(
        docker_executor,
        test_image,
        "cp /bin/busybox /tmp/x && /tmp/x true; dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1",
        job,
        tmp_bytes=4 * MiB,
        timeout_s=30,
    )
    assert result.reason is Reason.EXIT_CODE
    assert b"No space left" in result.stdout  # /tmp is a 4 MiB tmpfs
    assert b"Permission denied" in result.stderr  # ... and noexec


@pytest.mark.parametrize("mode", [OutputMode.LOOP, OutputMode.WATCH])
def test_disk_fill_of_output(
    docker_client: docker.DockerClient, test_image: str, job: tuple[Path, Path], mode: OutputMode
) -> None:
    executor = DockerExecutor(docker_client, output_mode=mode)
    script = (
        "i=0; while dd if=/dev/zero of=/output/f$i bs=1M count=2 2>/dev/null; "
        "do i=$((i+1)); done; exit 1"
    )
    result = run(executor, test_image, script, job, output_bytes=8 * MiB, timeout_s=30)
    assert result.reason is Reason.OUTPUT_TOO_LARGE, result
    assert "cap of 8388608 bytes" in result.message
    assert list(result.output_dir.iterdir()) == []  # nothing over the cap is handed on
    assert result.output_bytes == 0


@pytest.mark.parametrize("mode", [OutputMode.LOOP, OutputMode.WATCH])
def test_one_huge_file_in_output(
    docker_client: docker.DockerClient, test_image: str, job: tuple[Path, Path], mode: OutputMode
) -> None:
    executor = DockerExecutor(docker_client, output_mode=mode)
    script = "dd if=/dev/zero of=/output/big bs=1M count=100"
    result = run(executor, test_image, script, job, output_bytes=4 * MiB, timeout_s=30)
    assert result.reason is Reason.OUTPUT_TOO_LARGE, result


def test_sparse_file_counts_at_its_apparent_size(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    script = "dd if=/dev/zero of=/output/sparse bs=1 count=1 seek=1G"
    result = run(docker_executor, test_image, script, job, output_bytes=2 * MiB, timeout_s=30)
    assert result.reason is Reason.OUTPUT_TOO_LARGE, result


def test_too_many_files_in_output(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    script = "i=0; while [ $i -lt 400 ]; do touch /output/f$i 2>/dev/null; i=$((i+1)); done"
    result = run(docker_executor, test_image, script, job, output_files=50, timeout_s=30)
    assert result.reason is Reason.OUTPUT_TOO_LARGE, result
    assert "50 files" in result.message


def test_infinite_loop_times_out(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    result = run(docker_executor, test_image, "while :; do :; done", job, timeout_s=1.5)
    assert result.reason is Reason.TIMEOUT and result.timed_out
    assert result.exit_code is None
    assert 1.4 < result.duration_s < 10
    assert "time limit of 1.5 s" in result.message


def test_stdout_flood_is_capped(
    docker_executor: DockerExecutor, dockerd: Dockerd, test_image: str, job: tuple[Path, Path]
) -> None:
    """A flood of stdout and stderr: the kept tails are capped and dockerd writes no log file."""
    result = run(
        docker_executor,
        test_image,
        "cat /dev/zero | tr '\\0' x & yes 'stderr flood' >&2",
        job,
        log_bytes=64 * KiB,
        timeout_s=3,
    )
    assert result.reason is Reason.TIMEOUT
    assert len(result.stdout) == 64 * KiB and set(result.stdout) == {ord("x")}
    assert 0 < len(result.stderr) <= 64 * KiB and b"stderr flood\n" in result.stderr
    assert result.logs_truncated
    assert list((dockerd.data_root / "containers").glob("*/*-json.log*")) == []


def test_escape_attempts_are_contained(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path], tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret-3f9a"
    secret.write_text("host only")
    inp, _ = job
    before = (inp / "data.txt").read_bytes()
    attempts = {
        "proc1-root": "cat /proc/1/root/etc/shadow",
        "host-shadow": "cat /etc/shadow",
        "host-file": f"cat {secret} || cat /proc/1/root{secret}",
        "find-secret": "find / -name 'host-secret-*' 2>/dev/null | grep -q .",
        "write-input": "echo owned > /input/data.txt",
        "create-in-input": "touch /input/new",
        "write-rootfs": "touch /bin/evil",
        "mount": "mount -t tmpfs none /tmp",
        "mknod": "mknod /tmp/disk b 8 0",
        "chroot": "chroot / true",
        "nsenter": "nsenter -t 1 -m -u -n true",
        "sysctl": "echo 1 > /proc/sys/kernel/sysrq",
        "setuid": "chmod u+s /output && false",
        "dmesg": "dmesg | grep -q .",
        "docker-socket": "ls /var/run/docker.sock /run/docker.sock",
    }
    script = "".join(
        f"if ({cmd}) >/dev/null 2>&1; then echo ESCAPED:{name}; fi; "
        for name, cmd in attempts.items()
    )
    script += "hostname; ln -s /etc/passwd /output/passwd"  # a link for the uploader to follow
    result = run(docker_executor, test_image, script, job, timeout_s=30)

    assert b"ESCAPED" not in result.stdout, result.stdout.decode()
    assert result.stdout.strip() == b"job"
    assert (inp / "data.txt").read_bytes() == before
    assert sorted(p.name for p in inp.iterdir()) == ["data.txt"]
    # the symlink never reaches the output dir, and the run says why
    assert result.reason is Reason.OUTPUT_INVALID
    assert "/output/passwd is a symlink" in result.message
    assert list(result.output_dir.iterdir()) == []
