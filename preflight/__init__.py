"""preflight: find the node that will hang your multi-node training job, before you launch it.

This module must stay importable on a bare node (standard library only): it travels in the probe bundle.
"""

__version__ = "0.1.0"
