"""The Sarva dispatcher, rebuilt from its published description: the peer of ``bench/claims.py``.

FastAPI + SQLAlchemy (ORM sessions) + SQLite, one plain ``def`` endpoint (FastAPI runs it in its
thread pool), ``GET /jobs/next?node_id=``: take the first ``PENDING`` job ordered by priority
descending then ``created_at`` ascending, set it ``ASSIGNED`` with the node id, set the node
``BUSY``, write an audit row, commit. No locking: no ``SELECT ... FOR UPDATE``, no conditional
update, so two requests in flight at once can read the same first job and both assign it.
When no job is pending it answers 204. Served by uvicorn with the same options as our scheduler
(``python -m scheduler``: uvicorn's defaults, access log off).

This is the peer rebuilt from its description (the original source is not in this repository):
what is measured is that design, on this machine, driven by the same load generator as ours.

    python bench/peers/sarva.py --db /tmp/sarva.db --port 8100 [--seed-jobs 2000 --nodes 64]
"""

# no ``from __future__ import annotations``: FastAPI must resolve the endpoint's annotations,
# and ``Session`` in a dependency declared inside create_app would not resolve from a string
import argparse
import datetime as dt
import random
from collections.abc import Iterator
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Query, Response
from sqlalchemy import DateTime, ForeignKey, Integer, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(80))
    priority: Mapped[int] = mapped_column(Integer, index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="PENDING")
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime)
    assigned_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="IDLE")


class AuditLog(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    node_id: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))
    at: Mapped[dt.datetime] = mapped_column(DateTime)


def engine_for(db_path: str) -> Any:
    return create_engine(f"sqlite:///{db_path}", connect_args={"check_same_thread": False})


def seed(db_path: str, jobs: int, nodes: list[str], seed_: int = 7) -> None:
    """A fresh database with ``jobs`` PENDING jobs (priorities 0-9, one creation time each)
    and the ``nodes`` IDLE."""
    engine = engine_for(db_path)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    rng = random.Random(seed_)
    t0 = dt.datetime(2026, 1, 1)
    with Session(engine) as db:
        db.add_all(Node(id=n, status="IDLE") for n in nodes)
        db.add_all(
            Job(
                name=f"job-{i}",
                priority=rng.randrange(10),
                status="PENDING",
                created_at=t0 + dt.timedelta(milliseconds=i),
            )
            for i in range(jobs)
        )
        db.commit()
    engine.dispose()


def assignments(db_path: str) -> tuple[int, int]:
    """(audit rows written for assignments, jobs with more than one such row)."""
    engine = engine_for(db_path)
    with Session(engine) as db:
        rows = db.scalars(select(AuditLog.job_id).where(AuditLog.action == "ASSIGNED")).all()
    engine.dispose()
    seen: dict[int, int] = {}
    for job_id in rows:
        seen[job_id] = seen.get(job_id, 0) + 1
    return len(rows), sum(1 for c in seen.values() if c > 1)


def create_app(db_path: str) -> FastAPI:
    engine = engine_for(db_path)
    session_factory = sessionmaker(bind=engine)
    app = FastAPI(title="Sarva dispatcher (rebuilt)")

    def get_db() -> Iterator[Session]:
        db = session_factory()
        try:
            yield db
        finally:
            db.close()

    @app.get("/jobs/next")
    def next_job(node_id: Annotated[str, Query()], db: Annotated[Session, Depends(get_db)]) -> Any:
        job = db.scalars(
            select(Job)
            .where(Job.status == "PENDING")
            .order_by(Job.priority.desc(), Job.created_at.asc())
            .limit(1)
        ).first()
        if job is None:
            return Response(status_code=204)
        now = dt.datetime.now(dt.UTC)
        job.status = "ASSIGNED"
        job.node_id = node_id
        job.assigned_at = now
        node = db.get(Node, node_id)
        if node is not None:
            node.status = "BUSY"
        db.add(AuditLog(job_id=job.id, node_id=node_id, action="ASSIGNED", at=now))
        db.commit()
        return {"job_id": job.id, "name": job.name, "priority": job.priority}

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--db", required=True, help="SQLite file")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--seed-jobs", type=int, default=0, help="seed a fresh database first")
    ap.add_argument("--nodes", type=int, default=64, help="nodes node-0.. to seed")
    args = ap.parse_args()
    if args.seed_jobs:
        seed(args.db, args.seed_jobs, [f"node-{i}" for i in range(args.nodes)])
    uvicorn.run(create_app(args.db), host="127.0.0.1", port=args.port, access_log=False)


if __name__ == "__main__":
    main()
