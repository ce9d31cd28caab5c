"""The import path `site` would give this interpreter, found without running `site`: no .pth file's code runs.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle.

The bootstrap runs as `python3 -S` (preflight.transport.bootstrap.FLAGS), so sys.path holds the standard
library only. What a probe looks for among the node's installed packages (the driver probe: the nvidia-nccl-cu*
wheel's dist-info folder, torch's version.py) must be looked for where the job's own `python3` finds it. This
module adds what `site.main()` adds, in its order (CPython's Lib/site.py, 3.8 to 3.13):

1. a virtual environment's site-packages, when a pyvenv.cfg sits beside the interpreter or one level up
   (site.venv); its `include-system-site-packages = false` drops the system's and the user's directories;
2. the user's site-packages (site.check_enableusersite: not under -s, PYTHONNOUSERSITE or setuid);
3. the system's site-packages (site.getsitepackages: the distribution's own list, Debian's dist-packages
   included);

each only when it is a directory, each followed by the directories its .pth files name (sorted by file name;
a line that does not exist is skipped, as site does). A .pth line that starts with `import` is code: site runs
it, this module does not (an editable install's import hook, a conda or distutils shim, a certifi import), so a
package reachable only through such a hook is not found, and nothing of the node's runs inside the probe.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, List, Optional, Set, Tuple


def search_path() -> List[str]:
    """sys.path as `site` would leave it: sys.path itself where site ran, else sys.path and site's directories."""
    if not sys.flags.no_site:
        return list(sys.path)
    import site  # under -S its import defines the functions and runs none of them (site.main() is not called)

    path = list(sys.path)
    known = {_case(entry) for entry in path if entry}
    venv, system = _venv(sys.executable)
    prefixes = [sys.prefix, sys.exec_prefix]
    user = site.check_enableusersite()
    dirs: List[str] = []
    if venv is not None:
        dirs += _site_packages(site, [venv], True)
        if system:
            prefixes.insert(0, venv)
        else:
            prefixes, user = [venv], False
    if user:
        dirs.append(site.getusersitepackages())
    dirs += _site_packages(site, prefixes, venv is not None)
    for sitedir in dirs:
        if os.path.isdir(sitedir):
            _add_site_dir(sitedir, path, known)
    return path


def find_spec(name: str) -> Any:
    """importlib's spec of the top-level module `name` on search_path() (the bundle's own modules not consulted)."""
    import importlib.machinery
    import importlib.util

    if not sys.flags.no_site:
        return importlib.util.find_spec(name)
    return importlib.machinery.PathFinder.find_spec(name, search_path())


def _venv(executable: str) -> Tuple[Optional[str], bool]:
    """(the virtual environment's prefix, whether it includes the system site-packages), or (None, True)."""
    exe_dir = os.path.dirname(os.path.abspath(executable))
    prefix = os.path.dirname(exe_dir)
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(prefix, "pyvenv.cfg")):
        if os.path.isfile(conf):
            break
    else:
        return None, True
    system = "true"
    try:
        with open(conf, encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    system = value.strip().lower()
    except (OSError, ValueError):  # site would fail on it too; the prefix still holds the venv's packages
        pass
    return prefix, system == "true"


def _site_packages(site: Any, prefixes: List[str], in_venv: bool) -> List[str]:
    """site.getsitepackages(prefixes) as site.main() gets it, where in a venv sys.prefix is already the venv's:
    Debian's site.py lists <prefix>/lib/pythonX.Y/site-packages only then (sys.prefix != sys.base_prefix)."""
    if not in_venv:
        return site.getsitepackages(prefixes)
    out: List[str] = []
    for prefix in dict.fromkeys(p for p in prefixes if p):
        found = site.getsitepackages([prefix])
        own = os.path.join(prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
        out += found if own in found else [own] + found
    return out


def _add_site_dir(sitedir: str, path: List[str], known: Set[str]) -> None:
    """site.addsitedir without exec: the directory, then the existing directories its .pth files' lines name."""
    if _case(sitedir) not in known:
        path.append(sitedir)
        known.add(_case(sitedir))
    try:
        names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth") and not n.startswith("."))
    except OSError:
        return
    for name in names:
        for line in _pth_lines(os.path.join(sitedir, name)):
            if line.startswith(("import ", "import\t")):
                continue  # code: site would exec it; a probe never does
            entry = os.path.abspath(os.path.join(sitedir, line.rstrip()))
            if _case(entry) not in known and os.path.exists(entry):
                path.append(entry)
                known.add(_case(entry))


def _pth_lines(pth: str) -> List[str]:
    """The lines of a .pth file that are neither comments nor blank; none when it cannot be read."""
    try:
        with open(pth, "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _case(entry: str) -> str:
    return os.path.normcase(os.path.abspath(entry))
