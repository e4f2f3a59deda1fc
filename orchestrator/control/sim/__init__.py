"""Goodput at scale by simulation: the real controller, planner and cost model on simulated time.

The controller (``orchestrator.control.controller``) is driven through its ports, implemented here
by a simulated cluster, worker group, checkpoint store and clock (``world.py``); the planner is the
real :class:`~orchestrator.control.planning.MakePlanPlanner` (``planner.py``), whose wall time is
charged to the simulated clock. Failures come from a Poisson trace (``trace.py``); what each
recovery costs in simulated seconds comes from measured figures scaled by the stated model in
``costs.py``. ``restart.py`` plays the same trace through a checkpoint-restart baseline.
``run.py`` ties them together. Nothing here imports a framework: this is part of the pure core.
"""
