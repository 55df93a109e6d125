"""Cached images in matching: a node that has the job's image ranks first among nodes that fit
as well (a preference, never a gate), through either of the engine's two ways of finding it;
and the bounds on what a node may advertise (registration and heartbeat models)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from gridmarket.wire import (
    MAX_ADVERTISED_IMAGES,
    HeartbeatRequest,
    NodeCapacityIn,
    capacity_digest,
)
from scheduler.matching import (
    ExecutorKind,
    Match,
    MatchingEngine,
    NodeCapacity,
    rank_key,
    reference_match,
)

from .factories import GIB, job, node

IMAGE = "127.0.0.1:5000/gridmarket/busybox@sha256:" + "a" * 64
OTHER = "127.0.0.1:5000/gridmarket/python-numpy@sha256:" + "b" * 64


def engine_with(*nodes: NodeCapacity) -> MatchingEngine:
    engine = MatchingEngine()
    for capacity in nodes:
        engine.add_node(capacity)
    return engine


def chosen(engine: MatchingEngine, **kw: object) -> str:
    found = engine.match(job(**kw))  # type: ignore[arg-type]
    assert isinstance(found, Match), found
    return found.node_id


def test_a_node_with_the_image_is_preferred_over_a_cheaper_one_without() -> None:
    cheap = node("cheap", price_floor_wei_per_hour=10)
    cached = node("cached", price_floor_wei_per_hour=90, images=frozenset({IMAGE}))
    engine = engine_with(cheap, cached)
    assert chosen(engine, image=IMAGE) == "cached"
    # the preference is for that image only: another image, or none (WASM), goes by price
    assert chosen(engine, image=OTHER) == "cheap"
    assert chosen(engine) == "cheap"
    found = engine.match(job(image=IMAGE))
    assert isinstance(found, Match) and found.rank.pull == 0
    found = engine.match(job(image=OTHER))
    assert isinstance(found, Match) and found.rank.pull == 1


def test_the_image_is_a_preference_not_a_gate() -> None:
    engine = engine_with(node("plain"))
    assert chosen(engine, image=IMAGE) == "plain"
    # a holder that fails a hard gate is not chosen for its image
    dear = node("dear", price_floor_wei_per_hour=10**9, images=frozenset({IMAGE}))
    far = node("far", region="eu-west", images=frozenset({IMAGE}))
    small = node("small", cpu_cores=1, images=frozenset({IMAGE}))
    engine = engine_with(node("plain"), dear, far, small)
    assert chosen(engine, image=IMAGE, region="us", cpu_cores=2) == "plain"
    excluded = job(image=IMAGE, excluded_node_ids=frozenset({"holder"}))
    engine = engine_with(node("plain"), node("holder", images=frozenset({IMAGE})))
    found = engine.match(excluded)
    assert isinstance(found, Match) and found.node_id == "plain"


def test_best_fit_comes_before_the_image() -> None:
    """A holder with more GPUs than the job asks for does not take it from an exact fit: the
    big node stays free for a big job (the rank: fit, speed, then the image)."""
    exact = node("exact", count=1)
    big = node("big", count=4, images=frozenset({IMAGE}))
    engine = engine_with(exact, big)
    assert chosen(engine, image=IMAGE, gpu_count=1) == "exact"
    fast = node("fast", model="rtx-4090")
    slow = node("slow", model="rtx-3090", images=frozenset({IMAGE}))
    engine = engine_with(fast, slow)
    assert chosen(engine, image=IMAGE, gpu_models=None) == "fast"


def test_holders_are_kept_through_claims_releases_updates_and_removal() -> None:
    engine = engine_with(
        node("a", slots=2, images=frozenset({IMAGE})),
        node("b", price_floor_wei_per_hour=1),
    )
    assert engine.stats()["images"] == 1
    first = job("j1", gpu_count=0, image=IMAGE)
    engine.claim(first, "a")
    assert chosen(engine, job_id="j2", gpu_count=0, image=IMAGE) == "a"  # one slot left
    engine.release("j1")
    engine.update_node(node("a", slots=2))  # it evicted the image
    assert engine.stats()["images"] == 0
    assert chosen(engine, gpu_count=0, image=IMAGE) == "b"
    engine.update_node(node("a", slots=2, images=frozenset({IMAGE, OTHER})))
    assert engine.stats()["images"] == 2
    assert chosen(engine, gpu_count=0, image=OTHER) == "a"
    engine.remove_node("a")
    assert engine.stats()["images"] == 0
    assert chosen(engine, gpu_count=0, image=OTHER) == "b"


@pytest.mark.parametrize("holder_share", [0.005, 0.05, 0.9])
def test_the_engine_agrees_with_the_reference_on_random_fleets(holder_share: float) -> None:
    """Few holders (the engine looks through them) and many (it walks the group's buckets):
    both give the reference's answer, rank included, as nodes are claimed."""
    rng = random.Random(11 + int(holder_share * 100))
    images = [f"127.0.0.1:5000/img{i}@sha256:" + f"{i:x}" * 64 for i in range(1, 4)]
    engine = MatchingEngine()
    for i in range(400):
        held = frozenset(im for im in images if rng.random() < holder_share)
        engine.add_node(
            node(
                f"n{i:03d}",
                model=rng.choice(["rtx-4090", "rtx-3090", None]),
                count=rng.choice([1, 2]),
                cpu_cores=rng.choice([2, 4, 8]),
                ram_mib=rng.choice([8, 16, 32]) * GIB,
                price_floor_wei_per_hour=rng.randrange(1, 200),
                reputation=rng.uniform(0.3, 1.0),
                region=rng.choice(["us", "eu-west"]),
                slots=2,
                images=held,
            )
        )
    agreed = with_image = 0
    for k in range(300):
        gpu_count = rng.choice([0, 1])
        requirements = job(
            f"j{k}",
            gpu_count=gpu_count,
            gpu_models=None,
            cpu_cores=rng.choice([1, 2, 3]),
            ram_mib=rng.choice([1, 4, 12]) * GIB,
            region=rng.choice([None, "us"]),
            max_price_wei_per_hour=rng.randrange(50, 250),
            executor=ExecutorKind.DOCKER,
            image=rng.choice([*images, None]),
        )
        found = engine.match(requirements, explain=False)
        expected = reference_match(engine.nodes(), requirements)
        if isinstance(found, Match):
            assert found.node_id == expected, (k, found, expected)
            assert found.rank == rank_key(engine.node(found.node_id), requirements)
            with_image += requirements.image is not None and found.rank.pull == 0
            engine.claim(requirements, found.node_id)
        else:
            assert expected is None
        agreed += 1
    assert agreed == 300 and with_image >= 1  # some jobs were placed on a holder


def test_both_ways_of_finding_a_holder_pick_the_best_one() -> None:
    """Few holders among many equal nodes: the engine looks through the holders. Many holders
    (in groups that fit worse) against a small group: it walks the group's buckets."""
    many_equal = [node(f"eq{i:02d}", price_floor_wei_per_hour=10 + i) for i in range(40)]
    holders = [
        node("h-dear", price_floor_wei_per_hour=80, images=frozenset({IMAGE})),
        node("h-cheap", price_floor_wei_per_hour=70, images=frozenset({IMAGE})),
        node("h-big", cpu_cores=64, price_floor_wei_per_hour=1, images=frozenset({IMAGE})),
    ]
    engine = engine_with(*many_equal, *holders)
    assert chosen(engine, image=IMAGE) == "h-cheap"  # 3 holders <= 42 in the group
    small_group = [node("s1", price_floor_wei_per_hour=5), node("s2", price_floor_wei_per_hour=60,
                   images=frozenset({IMAGE})), node("s3", price_floor_wei_per_hour=50,
                   images=frozenset({IMAGE}))]  # fmt: skip
    elsewhere = [
        node(f"big{i:02d}", cpu_cores=64, price_floor_wei_per_hour=1, images=frozenset({IMAGE}))
        for i in range(20)
    ]
    engine = engine_with(*small_group, *elsewhere)
    assert chosen(engine, image=IMAGE) == "s3"  # 22 holders > 3 in the group: walked
    assert chosen(engine) == "s1"


# --------------------------------------------------------------------------- bounds


def _capacity(**kw: object) -> NodeCapacityIn:
    fields: dict[str, object] = {
        "cpu_cores": 2,
        "ram_mib": 2048,
        "disk_mib": 1024,
        "region": "eu-west",
        "executors": ["docker"],
    }
    fields.update(kw)
    return NodeCapacityIn.model_validate(fields)


def test_advertised_images_are_bounded_in_count_length_and_form() -> None:
    ok = [f"registry.example.com:5000/team/job-{i}@sha256:" + "0" * 64 for i in range(64)]
    assert len(_capacity(images=ok).images) == MAX_ADVERTISED_IMAGES
    assert _capacity(images=[IMAGE, IMAGE]).images == [IMAGE]  # repeats collapse
    too_many = [*ok, IMAGE]
    with pytest.raises(ValidationError, match="at most 64"):
        _capacity(images=too_many)
    with pytest.raises(ValidationError, match="at most 64"):
        HeartbeatRequest.model_validate({"images": too_many})
    long_name = "registry.example.com/" + "a" * 200 + "@sha256:" + "0" * 64
    for bad in [
        "busybox:1.36",  # a tag: jobs never name one
        "busybox@sha256:" + "0" * 64,  # no registry host
        "registry.example.com/x@sha256:" + "0" * 63,  # short digest
        "registry.example.com/X@sha256:" + "0" * 64,  # upper case
        "registry.example.com/x@sha256:" + "0" * 64 + " ; rm -rf /",
        long_name,  # over 255 characters
        "",
        7,
    ]:
        with pytest.raises(ValidationError):
            _capacity(images=[bad])
        with pytest.raises(ValidationError):
            HeartbeatRequest.model_validate({"images": [bad]})
    with pytest.raises(ValidationError):
        HeartbeatRequest.model_validate({"images": {"a": 1}})
    assert HeartbeatRequest.model_validate({}).images is None  # unchanged


def test_the_registration_digest_of_a_node_without_images_is_unchanged() -> None:
    """Agents that advertise nothing (no images, no token floors) sign the same digest as
    before images and token floors existed."""
    plain = _capacity()
    doc = plain.model_dump(mode="json")
    assert doc.pop("images") == []
    assert doc.pop("price_floors") == {}
    import hashlib
    import json

    before = hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).digest()
    assert capacity_digest(plain) == before
    assert capacity_digest(_capacity(images=[IMAGE])) != before
