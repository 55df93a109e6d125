"""``min_cuda`` and ``min_compute_capability`` on the submitter's side (issue 29, 6): the job
file takes them (quoted: YAML reads ``12.2`` as a number), a bad one is refused naming the
field, and the quote's "nodes that could run it" leaves out nodes below them or that did not
report them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from frontend_api.forms import FieldError, check_quote, quote_fits, spec_error
from frontend_api.jobfile import JobFileError, load_job_file
from gridmarket.wire import JobSpec, QuoteRequest

JOB = """\
name: train
executor: docker
image: registry.example.com/train@sha256:{digest}
resources:
  gpu_count: 2
  min_vram_mib: 16384
{extra}
bounty: 0.01
"""


def job_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(digest="ab" * 32, extra=extra), encoding="utf-8")
    return path


def test_the_job_file_takes_the_requirements(tmp_path: Path) -> None:
    extra = '  min_cuda: "12.2"\n  min_compute_capability: "8.0"'
    job = load_job_file(job_file(tmp_path, extra))
    spec = JobSpec.model_validate(job.spec)
    assert (spec.resources.min_cuda, spec.resources.min_compute_capability) == ("12.2", "8.0")


def test_an_unquoted_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as caught:
        load_job_file(job_file(tmp_path, "  min_cuda: 12.10"))
    message = str(caught.value)
    assert 'resources.min_cuda: write the version quoted, as "major.minor"' in message
    assert "unquoted 12.1 as a number, and 12.10 as 12.1" in message


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('  min_cuda: "12.x"', "resources.min_cuda: CUDA version must be major.minor like '12.2'"),
        ('  min_cuda: "999.0"', "resources.min_cuda: CUDA version '999.0' is out of range"),
        ('  min_compute_capability: "80"', "resources.min_compute_capability: compute capability"),
    ],
)
def test_a_bad_version_in_the_job_file_names_the_field(
    tmp_path: Path, extra: str, words: str
) -> None:
    with pytest.raises(JobFileError, match=words.replace("(", r"\(").replace(".", r"\.")):
        load_job_file(job_file(tmp_path, extra))


def test_the_form_error_names_the_field() -> None:
    doc = {"executor": "docker", "image": "busybox", "resources": {"gpu_count": 1, "min_cuda": "x"}}
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(doc)
    err = spec_error(caught.value)
    assert err.field == "spec.resources.min_cuda" and "major.minor" in err.message
    doc["resources"] = {"min_cuda": "12.0"}
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(doc)
    assert spec_error(caught.value).field == "spec.resources.gpu_count"


def node(gpu: dict[str, Any] | None) -> dict[str, Any]:
    capacity = {"executors": ["docker"], "cpu_cores": 8, "ram_mib": 32768, "disk_mib": 10**6}
    return {
        "status": "online",
        "region": "us",
        "tier": "rtx-4090",
        "capacity": {**capacity, "gpu": gpu},
    }


def test_the_quote_counts_only_nodes_that_meet_them() -> None:
    gpu = {"model": "rtx-4090", "vram_mib": 24564, "count": 2}
    new = node({**gpu, "cuda_version": "12.4", "compute_capability": "8.9"})
    old = node({**gpu, "cuda_version": "11.8", "compute_capability": "8.9"})
    unknown = node(gpu)
    req = QuoteRequest(gpu_count=1, min_cuda="12.2")
    assert [quote_fits(req, n) for n in (new, old, unknown)] == [True, False, False]
    req = QuoteRequest(gpu_count=1, min_compute_capability="9.0")
    assert [quote_fits(req, n) for n in (new, old, unknown)] == [False, False, False]
    assert [quote_fits(QuoteRequest(gpu_count=1), n) for n in (new, old, unknown)] == [True] * 3


def test_a_quote_without_gpus_cannot_require_them() -> None:
    with pytest.raises(FieldError) as caught:
        check_quote(QuoteRequest(min_cuda="12.0"))
    assert caught.value.field == "gpu_count"
    with pytest.raises(ValidationError, match="out of range"):
        QuoteRequest(gpu_count=1, min_cuda="99.0")
