"""Process managers for the local development stack (anvil, IPFS, dockerd).

Used by the demo, the tests and the benchmarks; nothing here is needed in production.
"""
