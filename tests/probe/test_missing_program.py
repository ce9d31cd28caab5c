"""A program that no PATH entry holds (nvidia-smi on a node without the driver) answers rc 127 without a process
being started (no fork, no watchdog line, no execve per PATH entry); one that is there but cannot be run still goes
to exec and answers as exec does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: runs each argv through a NodeContext, counting the processes the interpreter started (its audit events)
RUN = r'''
import json, sys
started = []
sys.addaudithook(lambda event, args: started.append(event) if event in ("subprocess.Popen", "os.posix_spawn",
                                                                          "os.fork") else None)
from preflight.probe.context import NodeContext
ctx = NodeContext(sysfs_root="/sys")
out = []
for argv in json.loads(sys.argv[1]):
    before = len(started)
    res = ctx.run(argv, timeout=10)
    out.append({"rc": res.rc, "stderr": res.stderr, "started": len(started) - before})
print(json.dumps(out))
'''


def _runs(tmp_path, argvs):
    env = dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"]), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(argvs)], env=env, cwd="/", capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_program_on_no_path_entry_is_127_without_a_process(tmp_path):
    (tmp_path / "bin").mkdir()
    missing, present = _runs(tmp_path, [["preflight-no-such-program", "-q"], ["true"]])
    assert missing == {"rc": 127, "stderr": "preflight-no-such-program: command not found", "started": 0}
    assert present["rc"] == 0 and present["started"] >= 1  # the twin: a program that is there is run


def test_a_program_there_but_not_executable_still_goes_to_exec(tmp_path):
    """The twin that must not be taken for missing: exec says EACCES (126), as before."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "preflight-not-executable").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "preflight-not-executable").chmod(0o644)
    (result,) = _runs(tmp_path, [["preflight-not-executable"]])
    assert result["rc"] == 126 and result["started"] >= 1, result
