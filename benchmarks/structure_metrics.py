"""Print the shape figures of a preflight checkout: back-arrows, in-function imports, long functions, bundle
size, the walks of the rules' facts, and how many files a new check touches.

    python3 benchmarks/structure_metrics.py [ROOT ...]     (ROOT: a checkout, default this one; several side by side)
    python3 benchmarks/structure_metrics.py --new-check    (also plant a throwaway check in a copy and run the guards)

Read from the sources with `ast` by tests/structure.py, the walker tests/test_structure.py guards with (nothing
of ROOT is imported except to build the bundle), so an old checkout is measured with the same code:

    back-arrows       imports (module level or inside a function) from a module to one in a higher layer, with
                      tests/structure.py's LAYERS (OLDER_TREE below places the older flat tree's modules)
    in-function       distinct (file, imported preflight module) pairs whose import sits inside a function
    functions > 80    functions and methods longer than 80 lines (decorators and docstring included)
    check -> check    a check's code importing another check's
    bundle            the probe bundle's size in bytes
    walks             from each check's rule(view), every preflight function reached through calls and function
                      references (static, depth-first): stops (functions, the rule included), files, climbs (calls
                      whose callee stands in a higher layer than its caller), depth; the longest walk, nccl_env's
                      and gpu_memory's
    new check         (--new-check) a minimal check folder (__init__.py, probe.py, rule.py) planted in a copy of
                      ROOT's tracked files; the guards that fail say which other files it must touch
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.structure import Shape  # noqa: E402 - the repository root is put on the path first

#: The older flat tree's modules (before structure v3) placed on today's layers, tried before LAYERS (BEFORE)
#: or after it (AFTER: a one-module check is judged as its rule), so an old checkout is measured by one order.
BEFORE = (
    ("node side", ("preflight/check_index.py",)),
    ("derived", ("preflight/datanet.py", "preflight/gpus.py", "preflight/rails.py", "preflight/nvls.py",
                 "preflight/output/envfabric.py", "preflight/output/envvars.py")),
    ("stages", ("preflight/allreduce/run.py",)),
    ("rules", ("preflight/allreduce/*",)),
    ("cli", ("preflight/cli.py", "preflight/nodecheck.py")),
)
AFTER = (("rules", ("preflight/checks/*.py",)),)

#: The throwaway check --new-check plants: a declaration, a probe and a rule, nothing else.
NEW_CHECK = {
    "__init__.py": '"""zz_new: a throwaway check planted by benchmarks/structure_metrics.py."""\n\n'
                   "from preflight.model import Check\n\nNAME = \"zz_new\"\n\n"
                   "CHECK = Check(name=NAME, claim=\"A planted claim\", why=\"Planted.\", fix=\"Nothing to fix.\", "
                   "order=99)\n",
    "probe.py": '"""zz_new\'s node half."""\n\n\ndef probe(ctx):\n    return {"ok": True}\n',
    "rule.py": '"""zz_new\'s controller half."""\n\nfrom preflight.model import Finding, Status\n\n\n'
               "def rule(view):\n"
               "    return [Finding(\"zz_new\", n.name, Status.PASS, \"planted\") for n in view.live]\n",
}
#: the guards a new check meets (each names what was forgotten)
GUARDS = ["tests/checks/test_catalogue.py", "tests/checks/test_fixtures.py", "tests/test_structure.py"]


def bundle_size(root: str) -> Optional[int]:
    code = "import preflight.transport.bundle as b; print(len(b.build_zip()) if hasattr(b, 'build_zip') else len(b._build_zip()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root, PREFLIGHT_CACHE_DIR=os.devnull))
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def measure(root: str) -> Dict[str, object]:
    shape = Shape(root, BEFORE, AFTER)
    walks = [w for w in (shape.walk(c) for c in shape.checks()) if w is not None]
    return {"modules": len(shape.modules), "back": shape.back_arrows(), "in_function": shape.in_function_imports(),
            "long": ["%s %d" % kv for kv in sorted(shape.long_functions(80).items())],
            "check_deps": shape.check_deps(), "bundle": bundle_size(root),
            "walks": {w.check: w for w in walks}, "longest": max(walks, key=lambda w: len(w.stops), default=None)}


def new_check_files(root: str) -> List[str]:
    """The guard failures a minimal new check meets in a copy of root's tracked files: the files it touches
    beyond its own folder are the ones they name."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if listed.returncode != 0:
        raise SystemExit("--new-check needs a git checkout (it copies the tracked files): %s" % root)
    with tempfile.TemporaryDirectory(prefix="preflight-newcheck-") as copy:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            src = os.path.join(root, rel)
            if os.path.isfile(src) and not os.path.islink(src):
                os.makedirs(os.path.dirname(os.path.join(copy, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(copy, rel))
        folder = os.path.join(copy, "preflight", "checks", "zz_new")
        os.makedirs(folder)
        for name, text in NEW_CHECK.items():
            with open(os.path.join(folder, name), "w") as fh:
                fh.write(text)
        done = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-rf",
                               *GUARDS], cwd=copy, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=copy, PREFLIGHT_CACHE_DIR=os.devnull, COLUMNS="1000"))
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if done.returncode not in (0, 1) or (done.returncode == 1 and not failed):
        raise SystemExit("the guards did not run in the copy (rc %d): %s" % (done.returncode, done.stdout[-2000:]))
    return failed


def report(root: str, m: Dict[str, object]) -> None:
    print("checkout            %s" % root)
    print("modules             %d" % m["modules"])
    print("back-arrows         %d" % len(m["back"]))
    for line in m["back"]:
        print("    " + line.split(": layer")[0])
    print("in-function imports %d (distinct file -> preflight module)" % len(m["in_function"]))
    print("functions > 80      %d" % len(m["long"]))
    for line in m["long"]:
        print("    " + line)
    print("check -> check      %d %s" % (len(m["check_deps"]), ", ".join(m["check_deps"])))
    print("bundle bytes        %s" % m["bundle"])
    walks = m["walks"]
    longest = m["longest"]
    print("longest walk        %s" % (longest.line() if longest else "(no rule found)"))
    for name in ("nccl_env", "gpu_memory"):
        if name in walks:
            print("walk                %s" % walks[name].line())
            for climb in walks[name].climbs:
                print("    climb " + climb)


def main(argv: List[str]) -> int:
    plant = "--new-check" in argv
    roots = [a for a in argv[1:] if a != "--new-check"] or [os.path.join(os.path.dirname(__file__), "..")]
    for root in map(os.path.abspath, roots):
        report(root, measure(root))
        if plant and not all(os.path.exists(os.path.join(root, g)) for g in GUARDS):
            print("new check           not planted: %s has not the guards %s (an older tree)"
                  % (root, ", ".join(GUARDS)))
        elif plant:
            failed = new_check_files(root)
            named = sorted({m.group(0) for line in failed for m in re.finditer(
                r"README\.md|docs/[\w/.-]+|tests/[\w/.-]+\.(?:py|json)", line.split(" - ", 1)[1] if " - " in line else "")})
            print("new check           %d files: 3 in its folder, and what %d failing guards name: %s"
                  % (3 + len(named), len(failed), ", ".join(named) or "-"))
            for line in failed:
                print("    " + line[:200])
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
