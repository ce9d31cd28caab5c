"""The probe bundle: the node-side code, zipped once, sent on stdin, imported from memory on the node.

The bootstrap below reads the zip (from stdin, or from a verified file) into memory and serves its
modules from there: nothing is unpacked, so there is no temp file to clean up even if the process is
killed. Under Slurm the zip is broadcast once per run as a file (preflight.slurm.broadcast: sbcast to a node-local,
content-addressed path) and stdin names it instead of carrying it: the second line is then
`@SHA256 PATH`. The bootstrap opens PATH with O_NOFOLLOW and uses it only if it is a regular file owned
by the user, not writable by group or others, whose SHA-256 is the one named, read once into memory and
imported from there; anything else prints `preflight-bundle-refused PATH: WHY` and exits 3 without
running a byte of it (a file with the wrong digest, which only the user can have written there, is
removed so the next broadcast can write it). Once the file is verified, the user's other versions beside
it (same name up to the digest) are removed: one bundle per user and version stays on a node.

Over SSH the zip is kept on the node between runs, in the same place and under the same checks: the
second line is `?SHA256 LENGTH`. The bootstrap uses /dev/shm/preflight-UID-bundle-SHA256.zip when it
passes the checks above; otherwise it prints `preflight-bundle-send PATH: WHY` and reads LENGTH bytes of
zip from stdin (the controller sends them when it sees that line), checks their SHA-256, and saves them
there (a temporary file opened O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, renamed into place) for the next
run, pruning the user's older versions. Where it cannot save (no /dev/shm, a read-only or full one,
another user's file at the name in the sticky folder) it says `preflight-bundle-unsaved PATH: WHY` and
runs from memory as before. A second run to the same node then sends ~100 bytes instead of ~600 KB.

Wire protocol (stdin → node):   one line of JSON config, one line with the zip's length, the zip bytes
                                (or the line `@SHA256 PATH`, or `?SHA256 LENGTH` and the zip only
                                if the node asks for it: above);
                                stdin then stays open: its EOF means the controller is gone. Under
                                Slurm every task reads the same stdin: the config is then
                                {"groups": [[[node, ...], config], ...]} (broadcast_config: nodes
                                with equal configs share one entry, so the line grows with the
                                distinct configs, not with nodes x config; a long one travels
                                deflated as {"z": base64}), picked by SLURMD_NODENAME (a node
                                not named exits at once). A config with "more": true keeps the
                                process after its result: the next line on stdin is the next
                                phase's config (JSON, same groups form; no zip: the modules are
                                loaded), so one srun step carries every phase.
Wire protocol (node → stdout):  `preflight-pid N` (from the login shell, before python starts),
                                `preflight-clock T` (the node's time.time() as soon as python runs),
                                then the result, framed: the JSON document deflated and base64-encoded
                                (text no marker can occur in), cut into chunks of config `line_max`
                                characters (srun cuts output lines longer than 1024 bytes; without
                                line_max: one chunk), sent as
                                    `preflight-part SEQ CHUNK`                      (SEQ 0, 1, ...)
                                    `preflight-result SEQ LENGTH CRC32 CHUNK`       (the last chunk)
                                where LENGTH is the whole base64 text's length and CRC32 its zlib.crc32
                                (8 hex digits). ResultReader puts a part split over several lines, two
                                lines joined into one, or a line duplicated back together, and detects
                                anything it cannot (a lost or damaged part): then the result is
                                "damaged" (ResultReader.damage says why), never a wrong document.
                                A bare `preflight-result {json}` line is read too (a plain document).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import io
import json
import logging
import marshal
import os
import re
import shlex
import stat
import sys
import threading
import time
import zipfile
import zlib
from types import CodeType
from typing import Any, Dict, List, Optional, Tuple

import preflight
from preflight.transport.bootstrap import BOOTSTRAP, bootstrap_argv  # noqa: F401 - the node's first lines, as bundle.*
from preflight.transport.contract import RunResult

#: a process kept for a next phase waits for its config this long past the phase's deadline (wait_s)
NEXT_PHASE_SLACK_S = 30

_zip_lock = threading.Lock()
_zip: List[bytes] = []


def base_zip() -> bytes:
    """The bundle, built once under a lock: 64 workers must not all zip it at the same moment."""
    with _zip_lock:
        if not _zip:
            _zip.append(_cached_zip())
        return _zip[0]


def _cached_zip() -> bytes:
    """The bundle from the user's cache when its sources have not changed, else built and stored there for the
    next run: building costs about 0.3 s (deflate, marshal, compiling every module at OPTIMIZE), on every
    run's first phase.

    The name carries a digest of the path, size and mtime of every file of the package (a superset of the
    bundle's sources, stat'ed, not read: a hit costs milliseconds) and of this Python's magic number, as a
    .pyc's header carries its source's; the newest CACHE_KEEP bundles are kept (one per install in use).
    Nothing is written into the installed package (a read-only or shared install works, and uninstalling
    leaves nothing behind): the cache is cache_dir(), and where it cannot be used the bundle is built every
    run.
    """
    stamp = [importlib.util.MAGIC_NUMBER.hex(), preflight.__version__, "optimize=%d" % OPTIMIZE]
    try:
        for path in _package_files():
            st = os.stat(path)
            stamp.append("%s %d %d" % (path, st.st_size, st.st_mtime_ns))
    except OSError:
        return _build_zip(_sources())
    folder = cache_dir()
    if folder is None:
        return _build_zip(_sources())
    path = os.path.join(folder, "bundle-%s.zip" % hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:20])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()
    except OSError:
        pass
    blob = _build_zip(_sources())
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
        _prune(folder)
    except OSError as exc:  # a full disk, or another run cleaned up first: this run has its bundle either way
        logging.getLogger(__name__).debug("bundle cache not written at %s: %s", folder, exc)
    return blob


#: bundles kept in the cache: several installs of one user (two venvs, a checkout beside a release) each keep
#: theirs instead of evicting one another's on every run
CACHE_KEEP = 4


def _prune(folder: str) -> None:
    """Remove all but the CACHE_KEEP newest bundles of this cache folder."""
    found = []
    for name in os.listdir(folder):
        if name.startswith("bundle-") and name.endswith(".zip"):
            found.append((os.lstat(os.path.join(folder, name)).st_mtime, name))
    for _mtime, name in sorted(found, reverse=True)[CACHE_KEEP:]:
        os.unlink(os.path.join(folder, name))


def _package_files() -> List[str]:
    """Every .py file of the installed package and the pynvml the bundle carries: what the cache key covers (a
    superset of the bundle's sources, found without reading one)."""
    root = os.path.dirname(os.path.abspath(preflight.__file__))
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    from preflight.probe.nvml import pynvml_source

    origin, _why = pynvml_source()
    return out + ([origin] if origin else [])


def cache_dir() -> Optional[str]:
    """This user's cache folder for preflight ($PREFLIGHT_CACHE_DIR, else $XDG_CACHE_HOME/preflight, else
    ~/.cache/preflight), created mode 0700; None when it cannot be used safely: not a real folder (a planted
    symlink), another user's, writable by others, or not creatable. PREFLIGHT_CACHE_DIR="" turns caching off."""
    given = os.environ.get("PREFLIGHT_CACHE_DIR")
    if given is not None:
        folder = given
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "preflight")
    if not folder or not os.path.isabs(folder):
        return None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return folder


#: where a node run starts: the bootstrap imports the runner; a bench run starts the agent and its ranks
#: start the worker by module name (python -m), which no import statement shows
NODE_ENTRY_POINTS = ("preflight/__init__.py", "preflight/probe/runner.py", "preflight/probe/bench_agent.py",
                     "preflight/probe/bench_worker.py", "preflight/probe/bench_compute.py")


def _sources() -> List[Tuple[str, str]]:
    """(file, name in the zip) of the node-side code: the entry points, every check's probe and the preflight
    modules they import (found by reading their imports, nothing imported), plus pynvml. The catalogue and the
    check declarations travel as empty packages (os.devnull; whole if a node module imports one by name): their
    preflight.model dataclasses cost a node more than its probes' imports. The rest stays home."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(preflight.__file__)))
    checks = os.path.join(root, "preflight", "checks")
    todo = [(rel, True) for rel in NODE_ENTRY_POINTS]
    for name in sorted(os.listdir(checks)):
        if os.path.isfile(os.path.join(checks, name, "probe.py")):
            todo.append(("preflight/checks/%s/probe.py" % name, True))
    whole: Dict[str, bool] = {}  # rel: travels whole (False: an empty package)
    while todo:
        rel, named = todo.pop(0)
        marker = _DECLARATION_RE.fullmatch(rel) is not None and not named
        if rel in whole and (whole[rel] or marker):
            continue
        whole[rel] = not marker
        todo.extend((p, False) for p in _packages_of(rel))
        if not marker:
            todo.extend((i, True) for i in _imported(root, rel))
    out = [(os.path.join(root, rel) if whole[rel] else os.devnull, rel) for rel in sorted(whole)]
    # found, not imported (12 ms): nvidia-ml-py's pynvml.py, never the legacy pynvml 11.x package folder
    from preflight.probe.nvml import PYNVML_FIX, pynvml_source

    origin, why = pynvml_source()
    if origin:
        out.append((origin, "pynvml.py"))
    else:
        sys.stderr.write("preflight: warning: the probe bundle carries no pynvml: %s; every node reads its GPUs "
                         "with nvidia-smi instead of NVML (%s)\n" % (why, PYNVML_FIX))
    return out


_DECLARATION_RE = re.compile(r"preflight/checks/(?:[^/]+/)?__init__\.py")


def _packages_of(rel: str) -> List[str]:
    """The __init__.py of every package above module `rel` (importing a module imports its packages)."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts) + 1)]


def _imported(root: str, rel: str) -> List[str]:
    """The preflight modules (paths relative to root) that module `rel` imports, anywhere in its body."""
    with open(os.path.join(root, rel), "rb") as fh:
        tree = ast.parse(fh.read(), rel)
    here = rel[:-3].replace("/", ".")
    package = here.rsplit(".", 1)[0] if not rel.endswith("/__init__.py") else here[: -len(".__init__")]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.extend([base] + ["%s.%s" % (base, alias.name) for alias in node.names])
    out = []
    for dotted in found:
        if dotted.split(".")[0] != "preflight":
            continue
        path = dotted.replace(".", "/")
        for candidate in (path + ".py", path + "/__init__.py"):
            if os.path.isfile(os.path.join(root, candidate)):
                out.append(candidate)
    return out


#: the bundle's bytecode is compiled as `python -OO` would: no docstrings, no asserts (the node-side code
#: relies on neither: tests/transport/test_bundle_bytecode.py guards it), 7% fewer bytes to every node
OPTIMIZE = 2


def _build_zip(sources: Optional[List[Tuple[str, str]]] = None) -> bytes:
    """The node-side code's sources and, for every module a probe run imports, its code compiled by this
    interpreter (bytecode/<name>c: a marshalled code object; bytecode/MAGIC: this Python's magic number).

    A node whose Python has the same magic number executes the code objects instead of compiling the
    source (about 30 ms of CPU per node, 60 ms more where pynvml is imported); any other version
    compiles the source, as before. Source only: the bench's agent and worker (imported by a bench
    run, not by a probe run).
    """
    skip = {"preflight/probe/bench_agent.py", "preflight/probe/bench_worker.py", "preflight/probe/bench_compute.py"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, name in sources if sources is not None else _sources():
            with open(path, "rb") as fh:
                source = fh.read()
            zf.writestr(_entry(name), source)
            if name not in skip:
                zf.writestr(_entry("bytecode/" + name + "c"), marshal.dumps(_code(path, name, source)))
        zf.writestr(_entry("bytecode/MAGIC"), importlib.util.MAGIC_NUMBER)
    return buf.getvalue()


def _entry(name: str) -> zipfile.ZipInfo:
    """A zip entry with a fixed date: the same sources give the same bundle, byte for byte."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _code(path: str, name: str, source: bytes) -> CodeType:
    """The module's code, named bundle/<name>, at OPTIMIZE: from a fresh .opt-2.pyc in __pycache__ when
    there is one (`python -OO -m compileall` writes them), else compiled now (0.3 s for the whole bundle,
    once: the bundle is cached, see _cached_zip)."""
    filename = "bundle/" + name
    try:
        with open(importlib.util.cache_from_source(path, optimization=OPTIMIZE or ""), "rb") as fh:
            head, body = fh.read(16), fh.read()
        st = os.stat(path)
    except (OSError, NotImplementedError, ValueError):
        head, body = b"", b""
    fresh = (
        len(head) == 16
        and head[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(head[4:8], "little") == 0  # timestamp-based pyc, checked below
        and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(head[12:16], "little") == len(source) & 0xFFFFFFFF
    )
    if fresh:
        try:
            return _renamed(marshal.loads(body), filename)
        except (EOFError, ValueError, TypeError):
            pass
    return compile(source, filename, "exec", dont_inherit=True, optimize=OPTIMIZE)


def _renamed(code: CodeType, filename: str) -> CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def digest() -> str:
    """The bundle's SHA-256 (hex), computed once per run (base_zip() is built once per run)."""
    blob = base_zip()
    with _zip_lock:
        if not _digest:
            _digest.append(hashlib.sha256(blob).hexdigest())
        return _digest[0]


_digest: List[str] = []


def stdin_payload(config: Dict[str, Any], file: Optional[Tuple[str, str]] = None, ask: bool = False) -> bytes:
    """What the bootstrap reads on stdin for one run: the config and the zip, or, with file=(path,
    sha256), the config and the line naming the zip already on the node, or, with ask=True, the config
    and the line `?SHA256 LENGTH`: the node uses the zip it kept from an earlier run, else asks for it
    (ResultReader.wants_bundle) and the caller sends base_zip() (see the module docstring)."""
    head = json.dumps(config, separators=(",", ":")).encode() + b"\n"
    if ask:
        return head + ("?%s %d\n" % (digest(), len(base_zip()))).encode()
    if file is not None:
        path, sha = file
        if not re.fullmatch(r"[0-9a-f]{64}", sha) or not path.startswith("/") or any(c in path for c in "\n\r"):
            raise ValueError("bundle file %r / %r: an absolute path and a SHA-256 in hex" % (path, sha))
        return head + ("@%s %s\n" % (sha, path)).encode()
    blob = base_zip()
    return head + str(len(blob)).encode() + b"\n" + blob


def file_name(uid: int, digest: str) -> str:
    """The bundle's name on a node: the user's, and its content's (the bootstrap removes the user's
    other versions by the part before the digest)."""
    return "preflight-%d-bundle-%s.zip" % (uid, digest)


#: a broadcast config longer than this travels deflated (base64 in {"z": ...})
BROADCAST_PLAIN_MAX = 4096


def broadcast_config(by_node: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """One config line for every node of a broadcast (srun --input=all): {"groups": [[[node, ...], config]]},
    nodes with the same config sharing one entry; the bootstrap picks its own by SLURMD_NODENAME.

    Every node reads the whole line, so configs that differ per node (phase 2's ping targets and
    rendezvous roles) make it grow with nodes x nodes: 33 KB to each of 64 nodes. Past
    BROADCAST_PLAIN_MAX it is sent deflated ({"z": base64}); such configs differ in a few addresses.
    """
    groups: Dict[str, List[str]] = {}
    for node, config in by_node.items():
        groups.setdefault(json.dumps(config, sort_keys=True, separators=(",", ":")), []).append(node)
    doc = {"groups": [[nodes, json.loads(text)] for text, nodes in groups.items()]}
    text = json.dumps(doc, separators=(",", ":")).encode()
    if len(text) <= BROADCAST_PLAIN_MAX:
        return doc
    return {"z": base64.b64encode(zlib.compress(text, 9)).decode("ascii")}


def remote_command(python: str) -> str:
    """The command line sent to the node's login shell. `python` was validated by the inventory and is quoted."""
    return "echo preflight-pid $$; exec %s" % " ".join(shlex.quote(arg) for arg in bootstrap_argv(python))


_PID_RE = re.compile(rb"preflight-pid (\d+)$")
_CLOCK_RE = re.compile(rb"preflight-clock (\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)$")
_REFUSED_RE = re.compile(rb"preflight-bundle-refused (.*)$")
_SEND_RE = re.compile(rb"preflight-bundle-send (.*)$")
_UNSAVED_RE = re.compile(rb"preflight-bundle-unsaved (.*)$")
#: a part or result frame, wherever it starts in a line (a line joined to the one before it, or after a
#: shell start-up file's output without a newline)
_FRAME_RE = re.compile(rb"preflight-(part|result) ")
_PART_RE = re.compile(rb"(\d+) ([A-Za-z0-9+/=]*)$")
_RESULT_RE = re.compile(rb"(\d+) (\d+) ([0-9a-f]{8}) ([A-Za-z0-9+/=]*)$")
#: a continuation: the rest of a frame the transport moved to a line of its own (base64 text only)
_CONTINUATION_RE = re.compile(rb"[A-Za-z0-9+/=]+$")


class ResultReader:
    """Reads one node's stdout as it arrives (the public result reader of the transport contract).

    feed(bytes) in any chunks (SSH: 64 KB reads; srun: one labelled line at a time); `pid` and
    `clock_at` are set as soon as their lines arrive; has_result() is True once the result frame is
    whole (or found damaged); finish(rc, sent_at, started) -> RunResult. `err` collects stderr.

    Linear in the output's size: each byte is looked at a bounded number of times (a line is only
    joined when its newline arrives; the frames are joined once, when the last one is in), so a 10 MB
    result costs what reading 10 MB costs, however many chunks or lines carry it.

    Framing (see the module docstring): frames are keyed by their sequence number; a line with no
    marker that holds only base64 text continues the frame before it (a line the transport split); a
    line holding several markers is several frames (lines it joined); a frame seen twice keeps its
    last copy. The whole is accepted only when every frame 0..SEQ is there and the length and CRC32
    match: anything else is `damage` (why), never a wrong document.
    """

    def __init__(self) -> None:
        self.err = bytearray()
        self.pid: Optional[int] = None
        self.clock: Optional[float] = None
        self.clock_at: Optional[float] = None
        self.result: Optional[Dict[str, Any]] = None
        self.damage: Optional[str] = None  # why a result frame that arrived gives no document
        self.refused: Optional[str] = None  # why the bootstrap refused the bundle file it was named (no run)
        self.wants_bundle: Optional[str] = None  # `?` mode: the node has no usable copy (why): send the zip
        self.unsaved: Optional[str] = None  # `?` mode: the node could not keep the zip it was sent (why)
        self.size = 0  # stdout bytes fed
        self._line: List[bytes] = []  # the pieces of the line not ended yet
        self._frames: Dict[int, List[bytes]] = {}
        self._have = 0  # characters in _frames
        self._current: Optional[int] = None  # the frame a continuation line belongs to
        self._final: Optional[Tuple[int, int, int]] = None  # (last seq, total length, crc32)
        self._done = False

    # feeding --------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.size += len(data)
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                if start < len(data):
                    self._line.append(data[start:])
                return
            piece = data[start:end]
            if self._line:
                self._line.append(piece)
                piece, self._line = b"".join(self._line), []
            self._take(piece.rstrip(b"\r"))
            start = end + 1

    def has_result(self) -> bool:
        """The result has arrived whole (or damaged past repair): nothing more of it will come."""
        return self._done

    def finish(self, rc: Optional[int], sent_at: float, started: float) -> RunResult:
        """The run's RunResult. Output cut off mid-line counts as nothing (a connection dropped mid-frame)."""
        if not self._done and self._final is not None:
            self.damage = self._missing() or "result incomplete: %d of %d characters" % (self._have, self._final[1])
        return RunResult(
            rc=rc,
            result=self.result,
            stderr=self.err.decode("utf-8", "replace")[-4000:],
            sent_at=sent_at,
            clock=self.clock,
            clock_received_at=self.clock_at,
            elapsed_s=time.monotonic() - started,
            damage=self.damage,
        )

    # one line -------------------------------------------------------------------------------------
    def _take(self, line: bytes) -> None:
        at = line.find(b"preflight-")
        if at < 0:
            if self._current is not None and not self._done and _CONTINUATION_RE.match(line):
                self._add(self._current, line, extend=True)
            return
        marks = [m.start() for m in _FRAME_RE.finditer(line, at)]
        if not marks:
            self._current = None
            self._meta(line)
            return
        head = line[:marks[0]]
        if self._current is not None and head and not self._done and _CONTINUATION_RE.match(head):
            self._add(self._current, head, extend=True)  # a split frame's rest, then the next frame joined to it
        for i, begin in enumerate(marks):
            self._frame(line[begin:marks[i + 1] if i + 1 < len(marks) else len(line)])

    def _meta(self, line: bytes) -> None:
        match = _REFUSED_RE.search(line)
        if match:  # nothing more will come: the bootstrap exits without running anything
            self.refused, self._done = match.group(1).decode("utf-8", "replace")[:300], True
            return
        match = _SEND_RE.search(line)
        if match:
            self.wants_bundle = match.group(1).decode("utf-8", "replace")[:300]
            return
        match = _UNSAVED_RE.search(line)
        if match:
            self.unsaved = match.group(1).decode("utf-8", "replace")[:300]
            return
        match = _PID_RE.search(line)
        if match:
            if self.pid is None:
                self.pid = int(match.group(1))
            return
        match = _CLOCK_RE.search(line)
        if match and self.clock is None:
            self.clock = float(match.group(1))
            self.clock_at = time.time()

    def _frame(self, text: bytes) -> None:
        if self._done:
            return
        if text.startswith(b"preflight-part "):
            match = _PART_RE.match(text, 15)
            self._current = None
            if match:
                self._add(int(match.group(1)), match.group(2))
            return
        body = text[17:]
        if body[:1] in (b"{", b"["):  # a plain document on one line
            self._current = None
            try:
                doc = json.loads(body.decode("utf-8", "replace"))
            except ValueError:
                return
            if isinstance(doc, dict):
                self.result, self._done = doc, True
            return
        match = _RESULT_RE.match(body)
        self._current = None
        if not match:
            return
        self._final = (int(match.group(1)), int(match.group(2)), int(match.group(3), 16))
        self._add(self._final[0], match.group(4))

    def _add(self, seq: int, chunk: bytes, extend: bool = False) -> None:
        if extend:
            self._frames[seq].append(chunk)
        else:
            self._have -= sum(len(c) for c in self._frames.get(seq, ()))  # a frame seen twice: the last copy
            self._frames[seq] = [chunk]
        self._have += len(chunk)
        self._current = seq
        if self._final is not None and len(self._frames) >= self._final[0] + 1:
            self._complete()

    def _missing(self) -> Optional[str]:
        assert self._final is not None
        lost = [i for i in range(self._final[0] + 1) if i not in self._frames]
        return "result frames lost in transit: %s of %d" % (",".join(map(str, lost[:5])), self._final[0] + 1) if lost else None

    def _complete(self) -> None:
        assert self._final is not None
        last, length, crc = self._final
        if self._have < length or self._missing():
            return  # a continuation, or a frame still on its way
        if self._have > length or len(self._frames) > last + 1:
            self.damage, self._done = "result damaged in transit: %d characters, expected %d" % (self._have, length), True
            return
        text = b"".join(b"".join(self._frames[i]) for i in range(last + 1))
        self._frames, self._done = {}, True
        if zlib.crc32(text) != crc:
            self.damage = "result damaged in transit: CRC32 %08x, expected %08x" % (zlib.crc32(text), crc)
            return
        try:
            doc = json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8"))
        except (ValueError, zlib.error) as exc:
            self.damage = "result unreadable: %s" % exc
            return
        if isinstance(doc, dict):
            self.result = doc
        else:
            self.damage = "result is not a JSON object"


def parse_output(stdout: bytes) -> Dict[str, Any]:
    """The protocol lines found in a run's whole stdout: pid, clock, result (each may be missing).

    A protocol line is found anywhere in a line, not only at its start: a node's shell start-up file
    that prints without a trailing newline ("Welcome" + "preflight-pid 123") must not hide the pid
    (the hung process would outlive the run) or the clock (the clock-skew check would go blind). Only
    complete lines count (a result cut off mid-line is no result), and a result that is not a JSON
    object, or arrives damaged, is no result, so a connection dropped mid-line is never a crash.
    """
    reader = ResultReader()
    reader.feed(stdout)
    found: Dict[str, Any] = {}
    if reader.pid is not None:
        found["pid"] = reader.pid
    if reader.clock is not None:
        found["clock"] = reader.clock
    if reader.result is not None:
        found["result"] = reader.result
    return found
