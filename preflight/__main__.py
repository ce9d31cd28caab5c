"""`python -m preflight` runs the CLI."""

import sys

from preflight.cli import main

sys.exit(main())
