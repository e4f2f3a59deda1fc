"""``orchestrator demo``: a local emulated mixed Ray cluster, a crash and a join, a summary."""
