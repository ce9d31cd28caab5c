"""The --json report's published schema (preflight/output/report.schema.json), checked on the documents tests make.

jsonschema is a test-time tool here, never a runtime dependency of preflight: the schema is published
for readers (audit pipelines), and the tests hold preflight's own output to it.
"""

from __future__ import annotations

from typing import Any, Dict

import jsonschema

from preflight.output import report


def assert_valid(doc: Dict[str, Any]) -> None:
    """The document matches the published schema, and its counts agree with its node list."""
    schema = report.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["schema_version"] == report.SCHEMA_VERSION
    counted = {s: sum(1 for n in doc["nodes"] if n["status"] == s) for s in report.NODE_STATUSES}
    assert doc["node_summary"] == counted, (doc["node_summary"], counted)
    assert doc["exit_code"] == (1 if doc["summary"]["fail"] or doc["summary"]["error"] or doc["summary"]["not_run"] else 0)
