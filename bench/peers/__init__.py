"""The published peers, rebuilt as code so that every ratio in the benches comes from one run."""
