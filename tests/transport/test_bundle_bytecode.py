"""The bundle's precompiled bytecode: used when the node's Python has the controller's magic number,
the source otherwise (a node with another Python version still runs every probe)."""

from __future__ import annotations

import importlib.util
import io
import json
import marshal
import subprocess
import sys
import zipfile

from preflight.transport import bundle


def rewrite(blob: bytes, magic: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, magic if info.filename == "bytecode/MAGIC" else src.read(info))
    return out.getvalue()


def run_bootstrap(blob: bytes) -> dict:
    """`python -c BOOTSTRAP` fed one probe run (the ssh check), as the transport feeds a node."""
    config = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 20, "deadline_s": 60}
    payload = json.dumps(config).encode() + b"\n" + str(len(blob)).encode() + b"\n" + blob
    # its own session: the bootstrap's watchdog kills its whole process group when stdin closes
    # and stdin stays open until the result is read (its EOF means "the controller is gone")
    proc = subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        out = b""
        for line in proc.stdout:
            out += line
            if line.startswith(b"preflight-result "):
                break
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    found = bundle.parse_output(out)
    assert "result" in found, out[-2000:]
    return found["result"]


def test_bundle_carries_bytecode_for_this_python():
    zf = zipfile.ZipFile(io.BytesIO(bundle.base_zip()))
    names = set(zf.namelist())
    assert zf.read("bytecode/MAGIC") == importlib.util.MAGIC_NUMBER
    for module in ("preflight/probe/runner.py", "preflight/model.py", "preflight/checks/nic/", "pynvml.py"):
        if module in names:
            code = marshal.loads(zf.read("bytecode/" + module + "c"))
            assert code.co_filename == "bundle/" + module
    assert "bytecode/preflight/checks/allreduce/__init__.pyc" not in names  # no node probe: never imported by a probe run
    assert all(n[len("bytecode/"):-1] in names for n in names if n.endswith(".pyc"))  # the source is always there


def test_node_with_the_same_python_runs_the_bytecode():
    result = run_bootstrap(bundle.base_zip())
    assert result["bytecode"] is True
    assert result["facts"]["ssh"].get("python")


def test_node_with_another_python_compiles_the_source():
    result = run_bootstrap(rewrite(bundle.base_zip(), b"\x00\x00\r\n"))
    assert result["bytecode"] is False
    assert result["facts"]["ssh"].get("python")


def test_the_bundle_is_cached_in_the_users_cache_and_rebuilt_when_a_source_changes(tmp_path, monkeypatch):
    """Building the zip costs about 0.1 s each run; the cache (the user's, mode 0700, files 0600) is keyed, like
    a .pyc, by every source's size and mtime: an edited source gives a new bundle (the newest CACHE_KEEP are kept,
    one per install in use), an unusable folder only means building every run."""
    import os
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    sources = []
    for path, name in bundle._sources():
        copy = src / name.replace("/", "_")
        shutil.copy(path, copy)
        sources.append((str(copy), name))
    cache = tmp_path / "cache"
    monkeypatch.setenv("PREFLIGHT_CACHE_DIR", str(cache))
    monkeypatch.setattr(bundle, "_sources", lambda: sources)
    monkeypatch.setattr(bundle, "_package_files", lambda: [p for p, _n in sources])  # the cache key
    built = []
    real_build = bundle._build_zip
    monkeypatch.setattr(bundle, "_build_zip", lambda s=None: built.append(1) or real_build(s))

    first = bundle._cached_zip()
    cached = sorted(os.listdir(cache))
    assert len(cached) == 1 and cached[0].startswith("bundle-") and built == [1]
    assert (os.stat(cache).st_mode & 0o777, os.stat(cache / cached[0]).st_mode & 0o777) == (0o700, 0o600)
    assert bundle._cached_zip() == first and built == [1]  # read back, not rebuilt

    edited = next(p for p, n in sources if n == "preflight/probe/runner.py")
    with open(edited, "a") as fh:
        fh.write("\n# edited\n")
    second = bundle._cached_zip()
    assert built == [1, 1] and second != first
    assert b"# edited" in zipfile.ZipFile(io.BytesIO(second)).read("preflight/probe/runner.py")
    now = sorted(os.listdir(cache))
    assert len(now) == 2 and set(cached) < set(now)  # the older one stays (another install may be using it)
    for n in range(bundle.CACHE_KEEP + 2):  # but no more than CACHE_KEEP of them
        with open(edited, "a") as fh:
            fh.write("\n# edit %d\n" % n)
        os.utime(edited, ns=(n + 10**18, n + 10**18))
        latest = bundle._cached_zip()
    assert len(os.listdir(cache)) == bundle.CACHE_KEEP

    shutil.rmtree(cache)
    cache.write_text("not a folder")  # cannot be used: built, still returned
    count = len(built)
    assert bundle._cached_zip() == latest and len(built) == count + 1


def test_the_cache_refuses_a_planted_symlink_or_a_folder_others_can_write(tmp_path, monkeypatch):
    """A cache folder that is a symlink (planted where a user's cache would be) or that group/others can write
    is not used: the bundle is built in memory, and nothing is read from or written through it."""
    import os

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(elsewhere)
    monkeypatch.setenv("PREFLIGHT_CACHE_DIR", str(link))
    assert bundle.cache_dir() is None
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("PREFLIGHT_CACHE_DIR", str(shared))
    assert bundle.cache_dir() is None
    monkeypatch.setenv("PREFLIGHT_CACHE_DIR", "")  # caching off
    assert bundle.cache_dir() is None
    monkeypatch.delenv("PREFLIGHT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundle.cache_dir() == str(tmp_path / "xdg" / "preflight")


def test_nothing_is_written_into_the_installed_package(tmp_path):
    """A run's bundle goes to the user's cache, never into the package folder (a read-only install works, and
    an uninstall leaves no stray __pycache__/bundle-*.zip that would shadow a later install)."""
    import os
    import subprocess
    import sys

    import preflight

    pkg = os.path.dirname(preflight.__file__)
    before = {n for n in os.listdir(os.path.join(pkg, "__pycache__")) if n.startswith("bundle-")} \
        if os.path.isdir(os.path.join(pkg, "__pycache__")) else set()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("PREFLIGHT_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", "from preflight.transport import bundle; bundle.base_zip()"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    after = {n for n in os.listdir(os.path.join(pkg, "__pycache__")) if n.startswith("bundle-")} \
        if os.path.isdir(os.path.join(pkg, "__pycache__")) else set()
    assert after == before
    assert [n for n in os.listdir(tmp_path / "xdg" / "preflight") if n.startswith("bundle-")]


def test_node_code_relies_on_no_assert_or_docstring():
    """The bundle's bytecode is compiled at bundle.OPTIMIZE (python -OO): asserts and docstrings are gone
    on the nodes. A node-side module that asserts, reads a __doc__ or tests __debug__ would behave
    differently from its source: run it differently, or lower bundle.OPTIMIZE."""
    import ast

    assert bundle.OPTIMIZE == 2
    names = set(zipfile.ZipFile(io.BytesIO(bundle.base_zip())).namelist())
    found = []
    for path, name in bundle._sources():
        if "bytecode/" + name + "c" not in names:
            continue
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                found.append("%s:%d: assert" % (path, node.lineno))
            elif isinstance(node, ast.Name) and node.id in ("__doc__", "__debug__"):
                found.append("%s:%d: %s" % (path, node.lineno, node.id))
            elif isinstance(node, ast.Attribute) and node.attr == "__doc__":
                found.append("%s:%d: .__doc__" % (path, node.lineno))
    assert not found, "node-side code that -OO bytecode changes:\n" + "\n".join(found)


def test_the_bytecode_has_no_docstrings_and_checks_without_a_probe_stay_home():
    from preflight import checks

    zf = zipfile.ZipFile(io.BytesIO(bundle.base_zip()))
    names = set(zf.namelist())
    code = marshal.loads(zf.read("bytecode/preflight/probe/runner.pyc"))
    assert not any(isinstance(c, str) and c.startswith("Node-side entry point") for c in code.co_consts)
    for name in checks.entries():
        sent = "preflight/checks/%s/probe.py" % name in names
        assert sent == checks.has_probe(name), name  # a probe run imports only the checks it probes
        assert ("preflight/checks/%s/__init__.py" % name in names) == sent, name  # the probe's package
        assert "preflight/checks/%s/rule.py" % name not in names, name  # rules run on the controller
