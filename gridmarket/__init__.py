"""GridMarket's ground floor: what the scheduler, the agent and the front end share, so they
cannot drift. It imports none of them (tests/test_layers.py checks it).

- :mod:`gridmarket.wire`: the documents between the parts (job spec, node messages, quotes,
  API paths); :mod:`gridmarket.escrow`: the contract's job model, limits and event fold;
  :mod:`gridmarket.eip712`: signed results; :mod:`gridmarket.tiers`: GPU tiers and regions;
  :mod:`gridmarket.cid`: UnixFS CIDs computed locally. These do no I/O.
- Adapters: :mod:`gridmarket.chain` (the escrow over web3), :mod:`gridmarket.ipfs` (verified,
  capped IPFS reads and checked adds), :mod:`gridmarket.keystore` (encrypted wallet keys),
  :mod:`gridmarket.deploy` and :mod:`gridmarket.build` (compiling and deploying the contracts),
  :mod:`gridmarket.cmdline` (what the two command lines share), :mod:`gridmarket.serving` (how the
  scheduler and the front end are served).

Modules here must not import docker, wasmtime or pynvml (the agent's executors and hardware
detection own those). The local grid for development and tests is the top-level ``devstack``
package, which no runtime package imports.
"""

__version__ = "0.1.0"
