"""``python -m scheduler`` as operators run it (the front end's stack starts it that way)."""

from __future__ import annotations

import re

import httpx

from gridmarket.wire import API

from .conftest import FrontendStack


def test_the_served_scheduler_freezes_its_start_up_heap(stack: FrontendStack) -> None:
    """``python -m scheduler`` moves what it built at start out of the cyclic collector's reach
    (``create_app(freeze_heap=True)``): full collections otherwise stopped the event loop for
    50-120 ms under load (docs/benchmarks.md, heartbeats). An app built in a test process does
    not (frozen garbage of earlier tests would never be collected)."""
    text = httpx.get(stack.scheduler.url + API.METRICS, timeout=10).text
    m = re.search(r"^gridmarket_gc_frozen_objects ([0-9.e+]+)$", text, re.M)
    assert m is not None, "the metric is missing"
    assert float(m.group(1)) > 10_000  # modules, models, the chain client, the store
