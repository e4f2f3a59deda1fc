"""Fixtures of the telemetry tests."""

from __future__ import annotations

import pytest
from telemetry_scenario import drive_scripted_run


@pytest.fixture
def scripted_run():
    """Drive a callback through a scripted run (see telemetry_scenario.drive_scripted_run)."""
    return drive_scripted_run
