"""Token jobs (escrow v4) in the matching engine: a job paid in an ERC-20 goes only to a node
with a floor in that token, its price gate and rank use that floor, and why it waits names the
token. (The hypothesis machine in test_matching_index.py checks the same against
``reference_match`` on random fleets with token floors.)"""

from __future__ import annotations

from scheduler.matching import Gate, Match, MatchingEngine, NodeCapacity, NoMatch

from .factories import job, node

TUSD = "0x" + "7a" * 20
EURC = "0x" + "e0" * 20


def engine_with(*nodes: NodeCapacity) -> MatchingEngine:
    engine = MatchingEngine(ban_below=0.2)
    for capacity in nodes:
        engine.add_node(capacity)
    return engine


def test_a_token_job_goes_only_to_a_node_with_a_floor_in_its_token() -> None:
    # the ETH-only node is the better fit (a CPU job on a CPU node) and the cheaper in ETH
    engine = engine_with(
        node("eth-only", model=None, price_floor_wei_per_hour=1),
        node("takes-tusd", price_floors={TUSD: 500}),
        node("takes-eurc", model=None, price_floors={EURC: 1}),
    )
    cpu_job = job(gpu_count=0, max_price_wei_per_hour=1000)
    found = engine.match(cpu_job)
    assert isinstance(found, Match) and found.node_id == "eth-only"  # ETH: every node
    found = engine.match(job(gpu_count=0, max_price_wei_per_hour=1000, token=TUSD))
    assert isinstance(found, Match) and found.node_id == "takes-tusd"
    assert found.rank.price == 500  # ranked by its floor in the job's token
    found = engine.match(job(gpu_count=0, max_price_wei_per_hour=1000, token=EURC))
    assert isinstance(found, Match) and found.node_id == "takes-eurc"


def test_the_price_gate_compares_the_offer_with_the_floor_in_the_jobs_token() -> None:
    # 100 wei/h ETH floor is far below the offer; the tUSD floor is what counts for a tUSD job
    engine = engine_with(node("a", price_floor_wei_per_hour=100, price_floors={TUSD: 300_000}))
    found = engine.match(job(max_price_wei_per_hour=299_999, token=TUSD))
    assert isinstance(found, NoMatch) and found.why is not None
    assert found.why.top_gate is Gate.PRICE
    assert isinstance(engine.match(job(max_price_wei_per_hour=300_000, token=TUSD)), Match)
    # an ETH job offering 300,000 wei/h passes the 100 wei/h ETH floor whatever the tUSD one
    assert isinstance(engine.match(job(max_price_wei_per_hour=150)), Match)


def test_among_token_takers_cheaper_in_the_token_wins_and_claims_free_the_node() -> None:
    engine = engine_with(
        node("dear", price_floor_wei_per_hour=1, price_floors={TUSD: 900}),
        node("cheap", price_floor_wei_per_hour=999, price_floors={TUSD: 100}),
    )
    tusd = job("t1", max_price_wei_per_hour=1000, token=TUSD)
    found = engine.match_and_claim(tusd)
    assert isinstance(found, Match) and found.node_id == "cheap"
    found = engine.match(job("t2", max_price_wei_per_hour=1000, token=TUSD))
    assert isinstance(found, Match) and found.node_id == "dear"  # "cheap" is busy
    engine.release("t1")
    found = engine.match(job("t3", max_price_wei_per_hour=1000, token=TUSD))
    assert isinstance(found, Match) and found.node_id == "cheap"
    engine.remove_node("cheap")
    engine.remove_node("dear")
    assert engine.stats()["tokens"] == 0  # no taker left indexed under the token


def test_why_a_token_job_waits_says_no_node_takes_the_token() -> None:
    engine = engine_with(node("a"), node("b"), node("c", price_floors={EURC: 1}))
    found = engine.match(job(token=TUSD))
    assert isinstance(found, NoMatch) and found.why is not None
    why = found.why
    assert why.top_gate is Gate.TOKEN and why.eliminated[Gate.TOKEN] == 3
    message = why.message({TUSD: "tUSD"})
    assert message.startswith("waiting: no node takes tUSD: 3 of 3 name no tUSD price floor")
    assert TUSD in why.message()  # without symbols it is named by its address
    # a node with a floor but too small: the token gate no longer has every node
    engine.add_node(node("d", cpu_cores=2, price_floors={TUSD: 1}))
    found = engine.match(job(token=TUSD))
    assert isinstance(found, NoMatch) and found.why is not None
    assert dict((g, n) for g, n in found.why.eliminated.items() if n) == {
        Gate.TOKEN: 3,
        Gate.CPU_CORES: 1,
    }


def test_eth_jobs_ignore_token_floors() -> None:
    engine = engine_with(node("a", price_floors={TUSD: 10**9}))
    found = engine.match(job(max_price_wei_per_hour=100))
    assert isinstance(found, Match) and found.rank.price == 100
