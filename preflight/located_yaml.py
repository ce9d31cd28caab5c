"""A YAML document with the line of every key and item, bounded before it is used.

The inventory's errors name file:line; this is where the lines come from. The document is refused, as
one located InventoryError, when it holds a control character, a YAML syntax error, a non-scalar or
duplicate key, a recursive alias, or more values than MAX_VALUES once aliases are counted where they
are used (an alias bomb): nothing unbounded reaches the validator (preflight.inventory).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

import yaml

from preflight.errors import InventoryError

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: libyaml's parser where PyYAML has it (its wheels do): 256 nodes' inventory in 4 ms instead of 28 ms
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Located:
    """The YAML document plus the line of every mapping key and sequence item (1-based)."""

    #: YAML values (aliases counted each time they are used) an inventory may hold: far beyond any real
    #: cluster's file, far below an alias bomb's billions
    MAX_VALUES = 200000

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines: Dict[Tuple[Any, ...], int] = {}
        self._count = 0
        self._open: set = set()
        bad = _CONTROL_RE.search(text)
        if bad:
            raise InventoryError(
                path, text.count("\n", 0, bad.start()) + 1,
                "control character %r in the file" % bad.group(), "delete it (a stray paste or binary file?)",
            )
        try:
            loader = _LOADER(text)
            try:
                node = loader.get_single_node()
                if node is None:
                    self.data: Any = None
                    return
                self._walk(node, ())
                self.data = loader.construct_document(node)
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else None
            raise InventoryError(
                path, line, "YAML syntax error: %s" % (exc.problem or exc.context), "fix the YAML at that line"
            ) from None
        except RecursionError:
            raise InventoryError(path, None, "the YAML nests too deeply", "flatten the file") from None
        except yaml.YAMLError as exc:
            raise InventoryError(path, None, "YAML error: %s" % exc, "fix the YAML") from None

    def _walk(self, node: yaml.Node, where: Tuple[Any, ...]) -> None:
        line = node.start_mark.line + 1
        self._count += 1
        if self._count > self.MAX_VALUES:
            raise InventoryError(
                self.path, line,
                "the inventory expands to more than %d values (aliases reused many times: an alias bomb?)" % self.MAX_VALUES,
                "write the values out, or use fewer nested aliases",
            )
        if id(node) in self._open:
            raise InventoryError(self.path, line, "recursive alias: a value contains itself", "remove the alias that points into its own anchor")
        self.lines[where] = line
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return
        self._open.add(id(node))
        try:
            self._walk_children(node, where)
        finally:
            self._open.discard(id(node))

    def _walk_children(self, node: yaml.Node, where: Tuple[Any, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: Dict[Any, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise InventoryError(
                        self.path, key_node.start_mark.line + 1,
                        "a key must be a plain name, not a %s" % ("list" if isinstance(key_node, yaml.SequenceNode) else "mapping"),
                        "write `name: value`",
                    )
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise InventoryError(
                        self.path,
                        line,
                        "duplicate key %r (first at line %d)" % (key, seen[key]),
                        "keep one of them",
                    )
                seen[key] = line
                self.lines[where + (key,)] = line
                self._walk(value_node, where + (key,))
                self.lines[where + (key,)] = line
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._walk(item, where + (index,))

    def line(self, *where: Any) -> Optional[int]:
        while where:
            if where in self.lines:
                return self.lines[where]
            where = where[:-1]
        return self.lines.get(())
