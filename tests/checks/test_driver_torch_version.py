"""torch/version.py read line by line where PyTorch generated it, through the syntax tree otherwise: the same facts
(or the same error) as reading every file through `ast`, without importing `ast` on a node with a generated file.
Formats: tests/fixtures/driver/torch_version_*.py (PyTorch's tools/generate_torch_version.py output, 1.13 to 2.5)
and the variants below."""

from __future__ import annotations

import glob
import os
import sys

import pytest

from preflight.checks.driver import probe as driver_probe
from preflight.node_model import ParseError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "driver", "torch_version_*.py")))
GENERATED = ("from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
             "__version__ = '2.4.1+cu124'\ndebug = False\ncuda: Optional[str] = '12.4'\n"
             "git_version = 'ee1b6804381c57161c477caa380a840a84167676'\nhip: Optional[str] = None\n")

VARIANTS = {
    "generated": GENERATED,
    "double quotes and a comment": '__version__ = "2.0.1"  # set by the build\ncuda = None\n',
    "annotated": "__version__: str = '2.1.0'\ncuda: 'Optional[str]' = '11.8'\n",
    "assigned twice, the last wins": "__version__ = '1.0'\n__version__ = '2.0'\ncuda = '12.1'\n",
    "computed version": "import os\n__version__ = os.environ.get('V', 'x') + '-dev'\ncuda = '12.4'\n",
    "a number for cuda": "__version__ = '2.0'\ncuda = 12.1\n",
    "bytes": "__version__ = b'2.0'\n",
    "an escape": "__version__ = '2\\x2e0'\ncuda = None\n",
    "an f-string": "v = '2'\n__version__ = f'{v}.0'\n",
    "two on a line": "__version__ = '2.0'; cuda = None\n",
    "a docstring quoting an assignment": '"""\ncuda = \'9.9\'\n"""\n__version__ = \'2.0\'\ncuda = None\n',
    "indented under an if": "import os\nif os.environ.get('X'):\n    cuda = '1.0'\n__version__ = '2.0'\n",
    "a name that starts like one": "cuda_home = '/usr/local/cuda'\n__version__ = '2.0'\n",
    "an attribute": "import types\ncuda = types.SimpleNamespace()\ncuda.x = '1'\n__version__ = '2.0'\n",
    "a continued line": "__version__ = \\\n    '2.0'\n",
    "not python": "__version__ = '2.0'\ncuda = None\ndef (:\n",
    "no version": "cuda = '12.1'\n",
    "tuple": "__version__, cuda = '2.0', '12.1'\n",
}


def _outcome(parse, text):
    try:
        return parse(text)
    except ParseError as exc:
        return "ParseError: %s" % exc
    except ValueError as exc:
        return "ValueError: %s" % exc


def _through_the_tree(text):
    """What the parser answered when every file went through ast."""
    original = driver_probe._generated_values
    driver_probe._generated_values = lambda _text: None
    try:
        return _outcome(driver_probe.parse_torch_version_py, text)
    finally:
        driver_probe._generated_values = original


@pytest.mark.parametrize("name", sorted(VARIANTS) + [os.path.basename(f) for f in FIXTURES])
def test_the_line_reading_answers_as_the_syntax_tree_does(name):
    text = VARIANTS.get(name)
    if text is None:
        with open(os.path.join(ROOT, "tests", "fixtures", "driver", name)) as fh:
            text = fh.read()
    assert _outcome(driver_probe.parse_torch_version_py, text) == _through_the_tree(text)


def test_generated_files_are_read_without_the_tree_and_the_others_with_it():
    assert driver_probe._generated_values(GENERATED) == {"__version__": "2.4.1+cu124", "cuda": "12.4"}
    for name in ("computed version", "a docstring quoting an assignment", "an escape", "not python", "tuple",
                 "two on a line", "a continued line"):
        assert driver_probe._generated_values(VARIANTS[name]) is None, name


def test_a_generated_version_py_is_read_without_importing_ast(monkeypatch):
    monkeypatch.setitem(sys.modules, "ast", None)  # an `import ast` now raises
    assert driver_probe.parse_torch_version_py(GENERATED) == {"version": "2.4.1+cu124", "cuda": "12.4"}
    with pytest.raises(ImportError):  # the twin: a file that needs the tree still asks for it
        driver_probe.parse_torch_version_py(VARIANTS["computed version"])
