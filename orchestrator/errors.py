"""Error types shared by every layer.

User mistakes raise :class:`UserError` (or a subclass) with a message that names the field and the
fix; the command line prints that one line and exits with code 2, without a traceback. Retryable
versus permanent is in the type, so callers never parse messages.
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base class of every error this package raises on purpose."""


class UserError(OrchestratorError, ValueError):
    """Bad input from the user: a file, a flag or a spec. Exit code 2 at the command line."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        parts = [f"{field}: {message}" if field else message]
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__(" — ".join(parts))
        self.field = field
        self.fix = fix

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the error intact when it crosses a Ray actor boundary (pickled).
        return (_rebuild_user_error, (type(self), str(self), self.field, self.fix))


def _rebuild_user_error(
    cls: type[UserError], text: str, field: str | None, fix: str | None
) -> UserError:
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.field = field
    err.fix = fix
    return err


class SpecError(UserError):
    """A cluster, model, training, job, plan or profile file is invalid."""


class InfeasibleError(UserError):
    """No plan fits: the message says how much memory is missing on which device type."""


class TransientError(OrchestratorError):
    """A failure worth retrying (a node died, an actor was lost, an API call timed out)."""


class PermanentError(OrchestratorError):
    """A failure that retrying will not fix (failure budget spent, corrupt state)."""


class NonFiniteStepError(PermanentError):
    """Training produced a non-finite loss or gradient norm; the step was not applied.

    Raised on every rank alike (they agree through one all-reduce), before the optimizer update,
    so no weight, optimizer state or checkpoint ever holds the non-finite values. Exit code 3 at
    the command line.
    """

    def __init__(self, message: str, step: int = -1) -> None:
        super().__init__(message)
        self.step = step

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.step))
