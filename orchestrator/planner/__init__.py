"""The choice: replica templates, exact layer splits, water-filled batch shares, ``make_plan``.

Pure functions of spec values; no ray, torch, kubernetes or prometheus_client.
"""

from orchestrator.planner.search import Baseline, PlanResult, make_plan, uniform_data_parallel
from orchestrator.planner.selection import SearchConfig

__all__ = ["Baseline", "PlanResult", "SearchConfig", "make_plan", "uniform_data_parallel"]
