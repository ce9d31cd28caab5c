"""A regular expression compiled on its first use, not at import: lazy(pattern, flags) stands for re.compile.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle. Compiling costs CPU on
every node and every run (the kernel-log patterns of xid, ib_errors and preflight.probe.nvrm: about 7 ms, a
tenth of a Python start); most of them parse lines a healthy node never logs, so they are compiled only where
such a line is found. A Lazy answers every method of the compiled pattern (match, search, finditer, findall,
sub, ...); `pattern` and `flags` are read without compiling. A match's `.re` is the compiled pattern, not the
Lazy: tell patterns apart by the Lazy itself (preflight.probe.nvrm), never by `m.re is ...`. Two threads that use it first at once both compile
it (re's own cache makes the second cheap); either result is the same pattern.
"""

import re


class Lazy:
    """re.compile(pattern, flags), done when a method is first called."""

    __slots__ = ("pattern", "flags", "_compiled")

    def __init__(self, pattern, flags=0):
        self.pattern, self.flags, self._compiled = pattern, flags, None

    def __getattr__(self, name):
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern, self.flags)
        return getattr(compiled, name)

    def __repr__(self):
        return "lazy(%r)" % (self.pattern,)


def lazy(pattern, flags=0):
    """A Lazy for pattern: compiled by the first call of one of its methods."""
    return Lazy(pattern, flags)
