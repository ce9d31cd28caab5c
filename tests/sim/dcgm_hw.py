"""A simulated DCGM: a `dcgmi` on the node's PATH that answers `dcgmi diag -r N -j` like the real one.

It prints a recorded document in the real shapes (tests/fixtures/dcgm/<case>.txt: DCGM 3.x or 4.x JSON,
or dcgmi's plain-text connection error), optionally after a banner line, and exits with the status the
real dcgmi gives for it (0, 226 a test failed, 205 isolate, 235 no nv-hostengine); or it hangs, as
level 2 does on some B200/GB200 systems, until it is killed. Any other arguments are refused, so a probe
that calls it differently fails loudly.

    install_dcgmi(node, "dcgm4_r1_pass_4gpu")                   # exit status from the case's .json (args[1])
    install_dcgmi(node, "dcgm4_r2_dbe_isolate", levels=(2,))    # only `-r 2` is answered
    install_dcgmi(node, hang=True)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, Sequence

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "dcgm")

SCRIPT = """#!{python}
# dcgmi (preflight simulator): `diag -r LEVEL -j` only
import sys, time
args = sys.argv[1:]
if len(args) != 4 or args[0] != "diag" or args[1] != "-r" or args[3] != "-j" or args[2] not in {levels!r}:
    sys.stderr.write("dcgmi (preflight simulator): expected diag -r {{%s}} -j, got %r\\n" % (",".join({levels!r}), args))
    sys.exit(2)
if {hang!r}:
    time.sleep(3600)
sys.stdout.write({banner!r})
sys.stdout.write({text!r})
sys.exit({rc!r})
"""


def install_dcgmi(node: Any, case: Optional[str] = None, rc: Optional[int] = None, hang: bool = False,
                  banner: str = "", levels: Sequence[int] = (1, 2, 3)) -> str:
    """Install the simulated dcgmi on node (anything with install_executable); returns its path."""
    text = ""
    if case is not None:
        with open(os.path.join(FIXTURES, case + ".txt")) as fh:
            text = fh.read()
        if rc is None:
            with open(os.path.join(FIXTURES, case + ".json")) as fh:
                rc = json.load(fh)["args"][1]
    return node.install_executable("dcgmi", SCRIPT.format(
        python=sys.executable, levels=[str(n) for n in levels], hang=hang, banner=banner, text=text, rc=rc or 0))
