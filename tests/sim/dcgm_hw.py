"""A simulated DCGM: a `dcgmi` on the node's PATH that answers `dcgmi diag -r N -j` like the real one.

It prints a recorded document in the real shapes (tests/fixtures/dcgm/<case>.txt: DCGM 3.x or 4.x JSON,
or dcgmi's plain-text connection error), optionally after a banner line, and exits with the status the
real dcgmi gives for it (0, 226 a test failed, 205 isolate, 235 no nv-hostengine); or it hangs, as
level 2 does on some B200/GB200 systems, until it is killed or (DCGM 3.3.8+) stops itself at --timeout. Any other arguments are refused, so a probe
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
# dcgmi (preflight simulator): `diag -r LEVEL -j [--timeout SECONDS]` only
import sys, time
args = sys.argv[1:]
stop = None
if len(args) == 6 and args[4] == "--timeout":
    if {old!r}:  # DCGM before 3.3.8 has no --timeout: TCLAP's parse error, exit 1
        sys.stderr.write("PARSE ERROR: Argument: --timeout\\n             Couldn't find match for argument\\n\\nUsage: \\n")
        sys.exit(1)
    stop, args = int(args[5]), args[:4]
if len(args) != 4 or args[0] != "diag" or args[1] != "-r" or args[3] != "-j" or args[2] not in {levels!r}:
    sys.stderr.write("dcgmi (preflight simulator): expected diag -r {{%s}} -j [--timeout N], got %r\\n" % (",".join({levels!r}), sys.argv[1:]))
    sys.exit(2)
if {hang!r}:
    if {hang!r} == "stops" and stop is not None:  # dcgmi stops the diagnostic at its own --timeout
        time.sleep(stop)
        sys.stdout.write('{{\\n   "DCGM Diagnostic" : {{\\n      "runtime_error" : "Error: Unable to complete diagnostic for group 2147483647. '
                         'Return: (-11) : Timeout\\\\n",\\n      "version" : "4.2.3"\\n   }}\\n}}\\n')
        sys.exit(245)
    time.sleep(3600)
sys.stdout.write({banner!r})
sys.stdout.write({text!r})
sys.exit({rc!r})
"""


def install_dcgmi(node: Any, case: Optional[str] = None, rc: Optional[int] = None, hang: Any = False,
                  banner: str = "", levels: Sequence[int] = (1, 2, 3), old: bool = False) -> str:
    """Install the simulated dcgmi on node (anything with install_executable); returns its path.

    hang=True: it never answers (only a kill ends it); hang="stops": the diagnostic hangs and dcgmi stops it
    at its own --timeout, as DCGM 3.3.8+ does (runtime_error "Timeout", exit 245). old=True: a dcgmi before
    3.3.8, which refuses --timeout."""
    text = ""
    if case is not None:
        with open(os.path.join(FIXTURES, case + ".txt")) as fh:
            text = fh.read()
        if rc is None:
            with open(os.path.join(FIXTURES, case + ".json")) as fh:
                rc = json.load(fh)["args"][1]
    return node.install_executable("dcgmi", SCRIPT.format(
        python=sys.executable, levels=[str(n) for n in levels], hang=hang, banner=banner, text=text, rc=rc or 0,
        old=old))
