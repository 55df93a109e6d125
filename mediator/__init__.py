"""The mediator, an app beside the scheduler with its own key, ruling on the results of the jobs
that name it (docs/mediator.md). ``gridmarket-mediator run ...`` or
``Mediator.connect(...).run_forever(stop)``. It imports only :mod:`gridmarket`."""

from mediator.service import (
    Decision,
    Mediator,
    MediatorConfig,
    MediatorError,
)
from mediator.state import MediatorState, Ruling, SpotSeed, StateError
from mediator.tasks import Kind

__all__ = [
    "Decision",
    "Kind",
    "Mediator",
    "MediatorConfig",
    "MediatorError",
    "MediatorState",
    "Ruling",
    "SpotSeed",
    "StateError",
]
