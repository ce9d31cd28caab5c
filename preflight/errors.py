"""The one error hierarchy. Only the CLI turns these into a message and an exit code."""

from __future__ import annotations

from typing import Optional

#: exit codes: nothing failed or errored; a check failed or errored (or `diff` found regressions); a usage or
#: inventory error; Ctrl-C (128 + SIGINT)
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class PreflightError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""

    exit_code = 2

    def __init__(self, message: str, fix: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message + ("; " + self.fix if self.fix else "")


class UsageError(PreflightError):
    """Bad command-line arguments."""


class InventoryError(PreflightError):
    """A problem in the inventory file, located at file:line."""

    def __init__(self, path: str, line: Optional[int], message: str, fix: Optional[str] = None) -> None:
        super().__init__(message, fix)
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = self.path if self.line is None else "%s:%d" % (self.path, self.line)
        return "%s: %s" % (where, PreflightError.__str__(self))
