"""The ``orchestrator`` command. Each sub-command lives in its own module with a ``register``."""
