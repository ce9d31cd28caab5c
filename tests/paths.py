"""Where the repository and the tests' data are, for every test module wherever it sits under tests/."""

import os

#: the tests folder (fixtures/, sim/)
TESTS = os.path.dirname(os.path.abspath(__file__))
#: the repository root (preflight/, README.md)
REPO = os.path.dirname(TESTS)
