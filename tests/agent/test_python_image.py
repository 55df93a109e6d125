"""The Python data job's image (Debian python3 + numpy, built offline) on a real dockerd: the
example analysis runs in the agent's sandbox on the sample dataset, and its numbers are numpy's
on the host and recover how the dataset was generated."""

from __future__ import annotations

import json
import math
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import docker
import numpy as np
import pytest
from numpy.typing import NDArray

from agent.executors import ExecutionSpec, Limits
from agent.executors.base import MiB
from agent.executors.docker import DockerExecutor
from devstack._process import ROOT, ServiceError
from devstack.images import (
    PYTHON_IMAGE,
    PYTHON_SCRIPT_IN_IMAGE,
    ensure_python_image,
    python_debs,
)
from frontend_api.jobfile import load_job_file
from gridmarket.tiers import REGIONS, TIERS

DATASET = ROOT / "examples" / "datasets" / "gpu-hours"
JOB_FILE = ROOT / "examples" / "jobs" / "python-hours-regression.yaml"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def python_image(docker_client: docker.DockerClient) -> str:
    try:
        ensure_python_image(docker_client)
    except ServiceError as exc:
        pytest.fail(f"cannot build {PYTHON_IMAGE}: {exc}", pytrace=False)
    return PYTHON_IMAGE


def run_job(executor: DockerExecutor, image: str, tmp_path: Path) -> Path:
    """The example job file's command on the sample dataset, as the agent runs it."""
    spec = load_job_file(JOB_FILE).spec
    assert spec["image"] == image
    inp = tmp_path / "input"
    shutil.copytree(DATASET, inp)
    job = ExecutionSpec(
        image=image,
        command=tuple(spec["command"]),
        limits=Limits(memory_bytes=spec["resources"]["ram_mib"] * MiB, timeout_s=120),
    )
    result = executor.run(job, inp, tmp_path / "output")
    assert result.ok, (result, result.stderr.decode(errors="replace"))
    assert b"400 rows" in result.stdout
    assert sorted(p.name for p in result.output_dir.iterdir()) == ["plot.svg", "result.json"]
    return result.output_dir


def host_fit() -> tuple[list[str], list[str], NDArray[np.float64], float, float]:
    """The same model fitted here, independently: (tiers, regions, coefficients, R^2, std)."""
    lines = (DATASET / "data.csv").read_text().split()[1:]
    rows = [line.split(",") for line in lines]
    tiers = sorted({r[0] for r in rows})
    regions = sorted({r[1] for r in rows})
    x = np.array(
        [[float(r[0] == t) for t in tiers] + [float(r[1] == g) for g in regions[1:]] for r in rows]
    )
    y = np.log([float(r[3]) for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    r2 = 1 - resid @ resid / ((y - y.mean()) ** 2).sum()
    return tiers, regions, coef, float(r2), math.sqrt(resid @ resid / (len(y) - x.shape[1]))


def test_regression_job_in_the_sandbox(
    docker_executor: DockerExecutor, python_image: str, tmp_path: Path
) -> None:
    out = run_job(docker_executor, python_image, tmp_path / "a")
    result = json.loads((out / "result.json").read_text())

    tiers, regions, coef, r2, std = host_fit()
    assert result["rows"] == 400 and result["coefficients"] == len(coef)
    assert result["reference_region"] == regions[0]
    assert sorted(result["tiers"]) == tiers and sorted(result["region_factor"]) == regions
    for j, tier in enumerate(tiers):
        got = result["tiers"][tier]["fitted_price_gwei_per_hour"]
        assert got == pytest.approx(math.exp(coef[j]), rel=1e-5), tier
    for i, region in enumerate(regions[1:]):
        got = result["region_factor"][region]
        assert got == pytest.approx(math.exp(coef[len(tiers) + i]), rel=1e-5), region
    assert result["region_factor"][regions[0]] == 1.0
    assert result["r_squared_log"] == pytest.approx(r2, rel=1e-5)
    assert result["residual_std_log"] == pytest.approx(std, rel=1e-5)

    # the descriptive numbers, from the CSV directly
    lines = [line.split(",") for line in (DATASET / "data.csv").read_text().split()[1:]]
    for tier, stats in result["tiers"].items():
        mine = [r for r in lines if r[0] == tier]
        assert stats["sales"] == len(mine)
        assert stats["gpu_hours"] == sum(int(r[2]) for r in mine)
        assert stats["revenue_gwei"] == sum(int(r[2]) * int(r[3]) for r in mine)

    # and the fit recovers how examples/datasets/make_gpu_hours.py priced the hours:
    # 100,000 gwei x tier multiplier x region multiplier x uniform noise in [0.85, 1.15]
    ref = REGIONS[regions[0]].multiplier
    for tier, stats in result["tiers"].items():
        truth = 100_000 * TIERS[tier].price_multiplier * ref
        assert stats["fitted_price_gwei_per_hour"] == pytest.approx(truth, rel=0.06), tier
    for region, factor in result["region_factor"].items():
        assert factor == pytest.approx(REGIONS[region].multiplier / ref, rel=0.06), region
    assert 0.98 < result["r_squared_log"] < 1.0
    assert result["residual_std_log"] == pytest.approx(0.0866, rel=0.1)  # std of log U(.85, 1.15)

    # the plot: well-formed SVG, one point per sale, one legend entry per tier
    root = ET.parse(out / "plot.svg").getroot()  # noqa: S314 - our own job's output
    assert root.tag == f"{SVG}svg" and root.get("viewBox") == "0 0 640 480"
    circles = root.findall(f"{SVG}circle")
    assert len(circles) == 400 + len(tiers)
    for c in circles:
        assert 0 <= float(c.get("cx", "-1")) <= 640 and 0 <= float(c.get("cy", "-1")) <= 480
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert set(tiers) <= set(texts)

    # deterministic: a second run writes the same bytes
    again = run_job(docker_executor, python_image, tmp_path / "b")
    for name in ("result.json", "plot.svg"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_image_is_small_offline_and_cached(
    docker_client: docker.DockerClient, python_image: str
) -> None:
    image = docker_client.images.get(python_image)
    assert image.attrs["Size"] < 100 * MiB, image.attrs["Size"]  # ~80 MB: no docs, no tests
    config = image.attrs["Config"]
    assert config["Cmd"] == ["python3", PYTHON_SCRIPT_IN_IMAGE]
    assert "org.gridmarket.python-debs-sha256" in (config.get("Labels") or {})
    # unchanged inputs: the image is reused, not rebuilt
    started = time.monotonic()
    assert ensure_python_image(docker_client) == image.id
    assert time.monotonic() - started < 5
    # a different script (a variant's inputs) builds another image, under its own tag
    variant = "gridmarket/python-numpy:variant-test"
    script = Path(__file__)  # any Python file: only the label and the baked-in file differ
    try:
        other = ensure_python_image(docker_client, variant, script=script)
        assert other != image.id
        assert ensure_python_image(docker_client, variant, script=script) == other
    finally:
        docker_client.images.remove(variant, force=True)


def test_missing_debs_say_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"setup_services\.sh"):
        python_debs(tmp_path)
    (tmp_path / "closure.txt").write_text("python3-numpy_1.24.2_amd64.deb\n")
    with pytest.raises(ServiceError, match=r"python3-numpy_1\.24\.2_amd64\.deb"):
        python_debs(tmp_path)
    assert len(python_debs()) > 30  # the real cache: the whole closure
