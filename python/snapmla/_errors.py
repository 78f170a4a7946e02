"""The one exception type of snapmla, and the helpers that phrase its messages."""

from __future__ import annotations

__all__ = ["SnapMLAError"]


class SnapMLAError(RuntimeError):
    """An snapmla call was refused or failed.

    Attributes:
        status: The C library's ``snapmla_status_t`` number when the C library reported the
            failure, else ``None`` (the Python layer refused the call before reaching C).
        argument: The name of the offending argument when known, else ``None``.
    """

    status: int | None
    argument: str | None

    def __init__(
        self, message: str, *, status: int | None = None, argument: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.argument = argument


def argument_error(op: str, argument: str, expected: str, got: str) -> SnapMLAError:
    """Build the error for a refused argument: ``"op: argument 'x': expected E, got G"``."""
    return SnapMLAError(
        f"{op}: argument '{argument}': expected {expected}, got {got}", argument=argument
    )
