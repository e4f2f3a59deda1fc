"""Goodput at scale by simulation: the real controller, planner and cost model on simulated time.

The controller (``orchestrator.control.controller``) is driven through its ports, implemented here
by a simulated cluster, worker group, checkpoint store and clock (``world.py``); the planner is the
real :class:`~orchestrator.control.planning.MakePlanPlanner` (``planner.py``), whose wall time is
charged to the simulated clock. Failures come from a Poisson trace (``trace.py``); what each
recovery costs in simulated seconds comes from measured figures scaled by the stated model in
``costs.py``. ``restart.py`` plays the same trace through a checkpoint-restart baseline.
``run.py`` ties them together. A client of the controller, not part of it: it imports control,
policies, planner, costmodel and spec, no framework, and nothing in the package imports it
(``bench/goodput_sim.py`` and the tests drive it).
"""
