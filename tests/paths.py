"""Where the repository and the tests' data are, for every test module wherever it sits under tests/."""

import os
import sys

#: the tests folder (fixtures/, sim/)
TESTS = os.path.dirname(os.path.abspath(__file__))
#: the repository root (preflight/, README.md)
REPO = os.path.dirname(TESTS)
#: the `preflight` script beside this Python, run as a subprocess (with PYTHONPATH it runs the tree under test)
PREFLIGHT = os.path.join(os.path.dirname(sys.executable), "preflight")
