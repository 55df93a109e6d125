"""The mediator mode of the scheduler: its own key, ruling on the integrity of results of the
jobs that name it (docs/mediator.md). ``gridmarket-mediator run ...`` or
``Mediator.connect(...).run_forever(stop)``."""

from scheduler.mediator.service import (
    CHECK,
    DISPUTE,
    REVEAL,
    Decision,
    Mediator,
    MediatorConfig,
    MediatorError,
)
from scheduler.mediator.state import MediatorState, Ruling, SpotSeed, StateError

__all__ = [
    "CHECK",
    "DISPUTE",
    "REVEAL",
    "Decision",
    "Mediator",
    "MediatorConfig",
    "MediatorError",
    "MediatorState",
    "Ruling",
    "SpotSeed",
    "StateError",
]
