"""The local development stack: process managers for anvil (:mod:`.anvil`), the js-ipfs daemon
(:mod:`.ipfs`), a private dockerd (:mod:`.dockerd`), throwaway PostgreSQL databases
(:mod:`.postgres`), a scheduler replica (:mod:`.scheduler`), the local test image
(:mod:`.images`), fresh provider wallets (:mod:`.providers`) and the whole grid on one machine
(:class:`.grid.LocalGrid`), all on one base (:class:`._process.Service`).

For the demo, the tests and the benchmarks only: it is installed with the project for
development, but it is not a runtime dependency. It sits above the apps (it starts the
scheduler, the agents and the front end), and ``gridmarket``, ``scheduler``, ``agent`` and
``frontend_api`` never import it (tests/test_layers.py checks that).
"""
