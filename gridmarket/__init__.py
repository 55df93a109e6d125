"""GridMarket: shared, I/O-free building blocks used by the scheduler, the agent and the tools.

Modules here must not import docker, wasmtime, pynvml or ipfshttpclient (those belong to the
agent's adapters); chain access lives in :mod:`gridmarket.chain`.
"""

__version__ = "0.1.0"
