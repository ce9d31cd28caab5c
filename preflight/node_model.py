"""The node side's share of the vocabulary (ParseError, CommandResult), cheap to import: no dataclasses.

Standard library only, Python 3.8 compatible: the probes and preflight.probe import these from here, not from
preflight.model, whose dataclasses (and the inspect, ast, dis and tokenize they import) cost every node about
a sixth of a Python start per run for declarations no node reads. preflight.model re-exports both names.
"""


class ParseError(ValueError):
    """A parser met output it does not understand. The message names the source and what was wrong."""


class CommandResult:
    """What one command run on the node returned. rc is 127 when the program does not exist."""

    __slots__ = ("argv", "rc", "stdout", "stderr", "timed_out")

    def __init__(self, argv, rc, stdout, stderr, timed_out=False):
        self.argv, self.rc, self.stdout, self.stderr, self.timed_out = argv, rc, stdout, stderr, timed_out

    @property
    def ok(self):
        return self.rc == 0 and not self.timed_out

    def _fields(self):
        return (self.argv, self.rc, self.stdout, self.stderr, self.timed_out)

    def __eq__(self, other):
        return self._fields() == other._fields() if type(other) is type(self) else NotImplemented

    __hash__ = None  # mutable, as the dataclass it replaces

    def __repr__(self):
        return "CommandResult(argv=%r, rc=%r, stdout=%r, stderr=%r, timed_out=%r)" % self._fields()
