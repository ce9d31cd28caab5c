"""The bundle's protocol lines are found however the node's shell decorates or cuts the output."""

from __future__ import annotations

from preflight.transport import bundle


def test_markers_found_anywhere_in_a_line():
    out = b"Welcome to gpu-07preflight-pid 4242\nLast loginpreflight-clock 1700000000.25\npreflight-result {\"facts\": {}}\n"
    assert bundle.parse_output(out) == {"pid": 4242, "clock": 1700000000.25, "result": {"facts": {}}}


def test_result_cut_mid_line_is_no_result_not_a_crash():
    out = b"preflight-pid 7\npreflight-clock 1.5\npreflight-result {\"facts\": {\"ssh\": {\"py"
    assert bundle.parse_output(out) == {"pid": 7, "clock": 1.5}
    assert bundle.parse_output(b"preflight-result {\"facts\n") == {}
    assert bundle.parse_output(b"preflight-result [1, 2]\n") == {}
