"""``orchestrator demo``: a local emulated heterogeneous Ray cluster, a crash and a join, a summary."""
