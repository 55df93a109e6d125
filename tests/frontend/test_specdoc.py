"""The front end's one decoder of job specs (``frontend_api/specdoc.py``): size bounded, depth
counted before any parser sees the bytes (Python's ``json`` raises RecursionError, not a
ValueError, on deep nesting), then checked against ``JobSpec``; a view gets a valid spec or the
reason, never an exception. The reader runs against the real js-ipfs daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from devstack.ipfs import IpfsDaemon
from frontend_api.specdoc import (
    MAX_SPEC_DEPTH,
    SpecReader,
    check_spec,
    decode_spec,
    job_spec,
    nests_deeper_than,
)
from gridmarket.cid import bytes_cid
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec

MODULE = bytes_cid(b"a module the specdoc tests never run")
VALID = JobSpec.model_validate({"name": "ok", "executor": "wasm", "module_cid": MODULE})


def test_deep_nesting_is_refused_before_json_sees_it() -> None:
    deep = b"[" * 20_000 + b"]" * 20_000
    # what the front end's old spec_of met, at Python's default recursion limit (this test
    # process runs with a raised one): a RecursionError, which is not a ValueError
    parse = "import json, sys; json.loads(sys.stdin.buffer.read())"
    run = subprocess.run([sys.executable, "-c", parse], input=deep, capture_output=True)
    assert run.returncode == 1 and b"RecursionError" in run.stderr, run.stderr[-300:]
    assert decode_spec(deep).problem == f"the spec nests deeper than {MAX_SPEC_DEPTH} levels"
    objects = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
    assert "nests deeper" in str(decode_spec(objects).problem)
    assert not nests_deeper_than(b"[" * MAX_SPEC_DEPTH + b"]" * MAX_SPEC_DEPTH)
    assert nests_deeper_than(b"[" * (MAX_SPEC_DEPTH + 1) + b"]" * (MAX_SPEC_DEPTH + 1))


def test_brackets_inside_strings_are_not_nesting() -> None:
    name = '[{"\\"' + "[" * 500 + "{" * 500
    spec = json.loads(VALID.to_bytes())
    spec["name"] = name[:80]
    spec["command"] = ["[" * 4000, '\\"{{{{' * 500]
    raw = json.dumps(spec).encode()
    assert raw.count(b"[") > MAX_SPEC_DEPTH
    assert not nests_deeper_than(raw)
    doc = decode_spec(raw)
    assert doc.problem is None and doc.spec is not None
    assert doc.spec["command"][0] == "[" * 4000


def test_a_scan_of_the_worst_input_is_linear() -> None:
    hostile = [
        b'"\\"' * (MAX_SPEC_BYTES // 3),  # a string that never ends, escapes throughout
        b'["' + b"[" * (MAX_SPEC_BYTES - 4) + b'"]',
        b'"' * MAX_SPEC_BYTES,
        b"[" * MAX_SPEC_BYTES,
    ]
    for raw in hostile:
        started = time.perf_counter()
        doc = decode_spec(raw)
        assert time.perf_counter() - started < 0.5, raw[:20]
        assert doc.spec is None and doc.problem, raw[:20]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"x" * (MAX_SPEC_BYTES + 1), f"over the {MAX_SPEC_BYTES}-byte cap"),
        (b'{"name": "half', "the spec is not JSON"),
        (b'{"name":"\xff"}', "the spec is not JSON: 'utf-8' codec can't decode byte 0xff"),
        (b"[1, 2]", "the spec is a JSON array, not an object"),
        (b'"spec"', "the spec is a JSON string, not an object"),
        (b"null", "the spec is a JSON null, not an object"),
        (b"7", "the spec is a JSON number, not an object"),
        (b'{"executor": "wasm", "module_cid": 7}', "the spec is invalid: module_cid:"),
        (
            json.dumps({"name": 5, "executor": ["wasm"], "command": 5, "resources": "x"}).encode(),
            "the spec is invalid: name: Input should be a valid string (and ",
        ),
    ],
)
def test_each_hostile_spec_gets_its_reason(raw: bytes, problem: str) -> None:
    doc = decode_spec(raw)
    assert doc.spec is None and doc.missing is None
    assert problem in str(doc.problem), doc.problem
    assert len(str(doc.problem)) <= 300


def test_a_valid_spec_comes_back_with_every_field_typed() -> None:
    doc = decode_spec(VALID.to_bytes())
    assert doc.problem is None and doc.spec is not None
    assert doc.spec == VALID.model_dump(mode="json")
    assert doc.spec["resources"]["ram_mib"] == VALID.resources.ram_mib
    assert doc.spec["command"] == [] and doc.spec["limits"]["timeout_s"] == 600


def test_the_schedulers_copy_is_checked_too() -> None:
    bad = {**VALID.model_dump(mode="json"), "command": 5}
    assert "command" in str(check_spec(bad).problem)
    assert check_spec(["not", "a", "spec"]).problem == "the spec is a JSON array, not an object"


@pytest.fixture
def reader(ipfs_daemon: IpfsDaemon) -> SpecReader:
    return SpecReader(lambda: IpfsStore(ipfs_daemon.api_addr), timeout_s=2.0)


def test_the_reader_fetches_decodes_and_caches_by_cid(
    reader: SpecReader, ipfs_daemon: IpfsDaemon
) -> None:
    with IpfsStore(ipfs_daemon.api_addr) as store:
        deep = store.add_bytes(b"[" * 20_000 + b"]" * 20_000)
        huge = store.add_bytes(b" " * (MAX_SPEC_BYTES + 1))
        mine = VALID.model_copy(update={"name": f"ok-{os.urandom(4).hex()}"})
        valid = store.add_bytes(mine.to_bytes())
    assert "nests deeper" in str(reader.read(deep).problem)
    assert "too large" in str(reader.read(huge).problem)
    doc = reader.read(valid)
    assert doc.problem is None and doc.spec == mine.model_dump(mode="json")
    assert reader.read(valid) is doc  # cached by CID


def test_a_spec_ipfs_lacks_is_missing_and_not_asked_for_again_at_once(reader: SpecReader) -> None:
    absent = bytes_cid(b"never added " + os.urandom(8))
    doc = reader.read(absent)
    assert doc.spec is None and doc.problem is None
    assert str(doc.missing).startswith("the spec could not be fetched from IPFS")
    started = time.monotonic()
    assert reader.read(absent) is doc
    assert time.monotonic() - started < 0.1


def test_a_valid_copy_at_the_scheduler_is_used_without_a_fetch(reader: SpecReader) -> None:
    absent = bytes_cid(b"not on IPFS " + os.urandom(8))
    held = {"state": "queued", "spec": VALID.model_dump(mode="json")}
    started = time.monotonic()
    doc = job_spec(reader, absent, held)
    assert time.monotonic() - started < 0.5
    assert doc.spec == VALID.model_dump(mode="json") and doc.missing is None
    # a copy that does not check out is not shown: the spec is read from IPFS instead
    wrong = {"state": "queued", "spec": {"command": 5}}
    assert job_spec(reader, absent, wrong).missing is not None
