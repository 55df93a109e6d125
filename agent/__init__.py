"""The provider's node agent (``gridmarket-agent``): detects the hardware, registers the node with
a message signed by the provider's wallet, long-polls the scheduler for work, runs each job
sandboxed and reports a signed result.

In the order a node starts and a job runs:

- :mod:`agent.cli`: the entry point; it starts the daemon (``run``) without typer or rich, and
  hands every other command to :mod:`agent.commands` (init, detect, register, run, status,
  earnings, withdraw, finalize); what they show in :mod:`agent.cli_display`, the stake and node
  file of ``register`` in :mod:`agent.signup`, the earnings and withdrawal in
  :mod:`agent.earnings`.
- :mod:`agent.config`: one ``AgentConfig`` from a file, ``GRIDMARKET_AGENT_*`` and flags.
- :mod:`agent.hardware`: GPUs (NVML, nvidia-smi), CPU, RAM, disk.
- :mod:`agent.capacity`: which executors can run here, and the capacity the node offers.
- :mod:`agent.assembly`: the executor factories, the runner and the daemon put together.
- :mod:`agent.client`: :class:`~agent.client.NodeSession`, the node's session with the
  scheduler (signed registration, token, heartbeats, next job, results), with backoff.
- :mod:`agent.acceptance`: whether to take an offered job on its terms (the policy), and the
  signed EIP-712 acceptance the escrow's ``assign`` needs.
- :mod:`agent.daemon`: the pull loop, heartbeats, result delivery and clean shutdown.
- :mod:`agent.runner`: one job: fetch, execute, upload, sign, report.
- :mod:`agent.executors` (Docker, WASM) and :mod:`agent.storage` (IPFS): the adapters.
- :mod:`agent.onchain`: the node's own transactions: submitting a result, the result guard
  (a result nobody relayed in time), finalizing its results after the challenge window;
  :mod:`agent.errors`: the agent's exception tree.
"""
