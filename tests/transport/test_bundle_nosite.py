"""The bootstrap runs without `site` (python3 -S, bootstrap.FLAGS): no .pth file's code runs inside a probe, and what
the probes look for among installed packages is still found where the node's python finds it (sitedirs).

Real virtual environments of this machine's interpreters (pyenv's CPython and, where present, Debian's
/usr/bin/python3, whose site.py lists dist-packages and treats venvs differently), real .pth files, the real
bootstrap started by the local transport as every transport starts it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from preflight.inventory import NodeSpec
from preflight.transport import bundle
from preflight.transport.local import LocalSession

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERPRETERS = [sys.executable] + [p for p in ("/usr/bin/python3",)
                                   if os.path.exists(p) and os.path.realpath(p) != os.path.realpath(sys.executable)]


def make_venv(python: str, where, system_site: bool = False) -> str:
    """A venv of `python` at `where` whose site-packages holds an NCCL wheel's dist-info, a torch (version.py only),
    a .pth naming an extra directory and a .pth whose import line leaves a marker file; its site-packages path."""
    flags = ["--system-site-packages"] if system_site else []
    subprocess.run([python, "-m", "venv", "--without-pip"] + flags + [str(where)], check=True, timeout=120)
    vpy = os.path.join(str(where), "bin", "python")
    site_packages = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                                   capture_output=True, text=True, timeout=60).stdout.strip()
    os.makedirs(os.path.join(site_packages, "nvidia_nccl_cu12-2.21.5.dist-info"))
    os.makedirs(os.path.join(site_packages, "torch"))
    with open(os.path.join(site_packages, "torch", "version.py"), "w") as fh:
        fh.write("__version__ = '2.4.1+cu124'\ncuda = '12.4'\n")
    extra = os.path.join(str(where), "extra")
    os.makedirs(extra)
    with open(os.path.join(site_packages, "aa_extra.pth"), "w") as fh:
        fh.write("# a comment\n\n%s\n/nonexistent/dir\n" % extra)
    with open(os.path.join(site_packages, "zz_code.pth"), "w") as fh:
        fh.write("import os; open(%r, 'w').write('ran')\n" % os.path.join(str(where), "pth-ran"))
    return site_packages


def test_a_probe_run_finds_the_venvs_nccl_wheel_and_torch_and_runs_none_of_its_pth_files(tmp_path):
    """Fails before -S: the bootstrap ran site, and the venv's zz_code.pth with it."""
    make_venv(sys.executable, tmp_path / "venv")
    spec = NodeSpec(name="n1", host="localhost", line=1, python=str(tmp_path / "venv" / "bin" / "python"), local=True)
    run = LocalSession(spec).run_bundle({"mode": "probe", "checks": {"driver": {}, "ssh": {}}}, deadline_s=120)
    facts = run.result["facts"]
    assert facts["driver"]["nccl_python"] == {"distribution": "nvidia-nccl-cu12", "version": "2.21.5"}, facts["driver"]
    assert facts["driver"]["torch"]["version"] == "2.4.1+cu124" and facts["driver"]["torch"]["cuda"] == "12.4"
    assert facts["driver"]["torch"]["path"].startswith(str(tmp_path / "venv" / "lib"))
    assert facts["ssh"]["python_executable"] == os.path.realpath(spec.python)  # the venv's interpreter ran it
    assert not (tmp_path / "venv" / "pth-ran").exists(), "a .pth file's import line ran inside the probe"


def test_the_twin_the_same_python_with_site_runs_that_pth_file(tmp_path):
    """The marker above can appear: the venv's own python, started as a job starts it, runs the .pth's import."""
    make_venv(sys.executable, tmp_path / "venv")
    subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", "pass"], check=True, timeout=60)
    assert (tmp_path / "venv" / "pth-ran").read_text() == "ran"


def test_every_transport_starts_the_bootstrap_without_site():
    assert bundle.bootstrap_argv("python3")[:3] == ["python3", "-S", "-c"]
    assert shlex.split(bundle.remote_command("/opt/py 3/bin/python3").split("; ", 1)[1]) == \
        ["exec"] + bundle.bootstrap_argv("/opt/py 3/bin/python3")


SEARCH = "import json, sys; from preflight.probe import sitedirs; print(json.dumps(sitedirs.search_path()))"
WITH_SITE = "import json, sys; print(json.dumps(sys.path))"


@pytest.mark.parametrize("python", INTERPRETERS)
@pytest.mark.parametrize("kind", ["base", "venv", "venv-system-site", "user-site"])
def test_the_path_found_without_site_is_the_one_site_gives(tmp_path, python, kind):
    """search_path() under -S lists what sys.path holds after site ran, in its order (the .pth code aside)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONNOUSERSITE", None)
    env["PYTHONUSERBASE"] = str(tmp_path / "userbase")
    interpreter = python
    if kind.startswith("venv"):
        make_venv(python, tmp_path / "venv", system_site=kind == "venv-system-site")
        interpreter = str(tmp_path / "venv" / "bin" / "python")
    if kind == "user-site":  # the user's site-packages exists (site adds it only then), with a .pth of its own
        user_site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"], env=env,
                                   check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        os.makedirs(os.path.join(user_site, "nvidia_nccl_cu11-2.14.3.dist-info"))
        os.makedirs(str(tmp_path / "from-user-pth"))
        with open(os.path.join(user_site, "u.pth"), "w") as fh:
            fh.write("%s\n" % (tmp_path / "from-user-pth"))
    with_site = json.loads(subprocess.run([interpreter, "-c", WITH_SITE], env=env, cwd="/", check=True,
                                          capture_output=True, text=True, timeout=60).stdout)
    # the tree under test goes on the path by sys.path.insert, so both paths start alike ('' for -c)
    found = json.loads(subprocess.run([interpreter, "-S", "-c", "import sys; sys.path.insert(1, %r); %s" % (ROOT, SEARCH)],
                                      env=env, cwd="/", check=True, capture_output=True, text=True, timeout=60).stdout)
    found.remove(ROOT)
    assert found == with_site
    if kind != "base":
        assert len(found) > len(json.loads(subprocess.run([interpreter, "-S", "-c", WITH_SITE], env=env, cwd="/",
                                                          capture_output=True, text=True, timeout=60).stdout))
    if kind == "user-site":
        # site adds the user's directory unless the interpreter is a venv's without the system's site-packages
        # (site.venv turns ENABLE_USER_SITE off), as when the tests run from `python3 -m venv .venv`
        probe = "import json, site, sys; print(json.dumps([site.ENABLE_USER_SITE, sys.prefix != sys.base_prefix]))"
        enabled, in_venv = json.loads(subprocess.run([python, "-c", probe], env=env, cwd="/", check=True,
                                                     capture_output=True, text=True, timeout=60).stdout)
        assert enabled or in_venv
        assert (str(tmp_path / "from-user-pth") in found) is bool(enabled)
