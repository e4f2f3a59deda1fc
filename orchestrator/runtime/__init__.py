"""Ray adapters: discovery, placement, worker actors and the worker group.

The only package that imports ``ray``. torch is imported inside the actors only, so the driver and
the controller stay light.
"""
