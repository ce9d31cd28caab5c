"""The streaming half of the API-server double: exec and attach over WebSocket (tests/sim/kubeapi.py serves REST).

Wire format (k8s.io/apimachinery/pkg/util/remotecommand, KEP-4006 for v5): an HTTP/1.1 GET upgraded to
WebSocket (RFC 6455) with subprotocol v5.channel.k8s.io or v4.channel.k8s.io; every binary message's
first byte is its channel: 0 stdin, 1 stdout, 2 stderr, 3 the final metav1.Status (exit code in
details.causes[{reason: ExitCode}]), 4 terminal resize; v5 adds 255 = "close channel N" (kubectl 1.30+
sends [255, 0] when its own stdin ends). Client frames are masked; the server's are not.

exec runs a new process per stream. attach joins the process a Job pod runs (PodProcess): the stream
sees its output from the moment it attaches (as from a kubelet; earlier output is only in the pod's
log), and with stdinOnce the process's stdin closes when the first attach ends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SUBPROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


def ws_accept(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()


def ws_frame(opcode: int, payload: bytes) -> bytes:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


def _read_exact(rfile: Any, n: int) -> bytes:
    data = rfile.read(n)
    if data is None or len(data) < n:
        raise EOFError("connection closed")
    return data


def ws_read(rfile: Any) -> Tuple[int, bytes]:
    """One whole message: (opcode, payload), continuation frames joined, client masking removed."""
    opcode, parts = None, []
    while True:
        b0, b1 = _read_exact(rfile, 2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", _read_exact(rfile, 2))[0]
        elif n == 127:
            n = struct.unpack("!Q", _read_exact(rfile, 8))[0]
        mask = _read_exact(rfile, 4) if b1 & 0x80 else b""
        data = _read_exact(rfile, n)
        if mask and n:  # XOR with the repeated 4-byte key, as one big-integer operation (the bundle is ~500 KB)
            key = (mask * (n // 4 + 1))[:n]
            data = (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
        op = b0 & 0x0F
        if op >= 8:  # control frames may come between fragments
            return op, data
        if opcode is None:
            opcode = op
        parts.append(data)
        if b0 & 0x80:
            return opcode, b"".join(parts)


def upgrade(handler: Any) -> Optional[str]:
    """Answer 101 with the best subprotocol offered; None (after an error reply) when it cannot."""
    if handler.headers.get("Upgrade", "").lower() != "websocket":  # kubectl's SPDY fallback (POST) is not served
        handler._fail(400, "BadRequest", "Upgrade request required")
        return None
    offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    proto = next((p for p in SUBPROTOCOLS if p in offered), None)
    if proto is None:
        handler._fail(400, "BadRequest", "no supported subprotocol in %s" % offered)
        return None
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", ws_accept(handler.headers["Sec-WebSocket-Key"]))
    handler.send_header("Sec-WebSocket-Protocol", proto)
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True
    return proto


def exit_status(rc: int, command: List[str]) -> Dict[str, Any]:
    if rc == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "message": "command terminated with non-zero exit code: error executing "
            "command [%s], exit code %d" % (" ".join(command[:2]), rc), "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(rc if rc > 0 else 128 - rc)}]}}


class Stream:
    """The server side of one upgraded connection: ordered sends from any thread."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.lock = threading.Lock()

    def send(self, opcode: int, payload: bytes) -> None:
        with self.lock:
            try:
                self.handler.wfile.write(ws_frame(opcode, payload))
                self.handler.wfile.flush()
            except (OSError, ValueError):
                pass

    def data(self, channel: int, chunk: bytes) -> None:
        self.send(2, bytes([channel]) + chunk)

    def end(self, status: Dict[str, Any]) -> None:
        self.data(3, json.dumps(status).encode())
        self.send(8, struct.pack("!H", 1000))
        try:
            self.handler.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def read_client(self, proto: str, stdin: Callable[[bytes], None], close_stdin: Callable[[], None]) -> None:
        """The client's frames until it goes: stdin data, v5's close of channel 0, pings; then close_stdin()."""
        try:
            while True:
                op, data = ws_read(self.handler.rfile)
                if op == 8:
                    break
                if op == 9:
                    self.send(10, data)
                    continue
                if op not in (1, 2) or not data:
                    continue
                if data[0] == 0:
                    stdin(data[1:])
                elif data[0] == 255 and data[1:2] == b"\x00" and proto.startswith("v5"):
                    close_stdin()
        except (EOFError, OSError, ValueError):
            pass
        close_stdin()  # the stream is gone: like a runtime, EOF on stdin, nothing killed


def _writer(proc: subprocess.Popen) -> Tuple[Callable[[bytes], None], Callable[[], None]]:
    def write(data: bytes) -> None:
        try:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.write(data)
                proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close() -> None:
        try:
            if proc.stdin:
                proc.stdin.close()
        except (OSError, ValueError):
            pass
    return write, close


def exec_stream(handler: Any, proc: subprocess.Popen, proto: str, command: List[str]) -> None:
    """One exec: the process's stdout/stderr out, the client's stdin in, its exit status last."""
    stream = Stream(handler)

    def pump(fh: Any, channel: int) -> None:
        for chunk in iter(lambda: os.read(fh.fileno(), 32768), b""):
            stream.data(channel, chunk)

    pumps = [threading.Thread(target=pump, args=(proc.stdout, 1), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, 2), daemon=True)]
    for t in pumps:
        t.start()
    threading.Thread(target=stream.read_client, args=(proto,) + _writer(proc), daemon=True).start()
    rc = proc.wait()
    for t in pumps:
        t.join()
    for fh in (proc.stdout, proc.stderr):
        fh.close()
    stream.end(exit_status(rc, command))


class PodProcess:
    """The main process of a Job pod: its output goes to the pod's log and to whoever is attached."""

    def __init__(self, proc: subprocess.Popen, command: List[str], stdin_once: bool,
                 on_exit: Callable[[int], None]) -> None:
        self.proc = proc
        self.command = command
        self.stdin_once = stdin_once
        self.log = bytearray()
        self.streams: List[Stream] = []
        self.lock = threading.Lock()
        self.rc: Optional[int] = None
        self.attached = False
        self._pumps = [threading.Thread(target=self._pump, args=(proc.stdout, 1), daemon=True),
                       threading.Thread(target=self._pump, args=(proc.stderr, 2), daemon=True)]
        for t in self._pumps:
            t.start()
        threading.Thread(target=self._wait, args=(on_exit,), daemon=True).start()

    def _pump(self, fh: Any, channel: int) -> None:
        for chunk in iter(lambda: os.read(fh.fileno(), 32768), b""):
            with self.lock:
                self.log += chunk
                streams = list(self.streams)
            for stream in streams:
                stream.data(channel, chunk)

    def _wait(self, on_exit: Callable[[int], None]) -> None:
        rc = self.proc.wait()
        for t in self._pumps:
            t.join()
        for fh in (self.proc.stdout, self.proc.stderr):
            fh.close()
        with self.lock:
            self.rc = rc
            streams, self.streams = list(self.streams), []
        for stream in streams:
            stream.end(exit_status(rc, self.command))
        on_exit(rc)

    def attach(self, handler: Any, proto: str) -> None:
        """Serve one attach until the process ends (the status then ends the stream) or the client goes."""
        stream = Stream(handler)
        write, close = _writer(self.proc)
        with self.lock:
            if self.rc is not None:
                done = True
            else:
                done = False
                self.streams.append(stream)
        if done:
            return stream.end(exit_status(self.rc or 0, self.command))
        stream.read_client(proto, write, close if self.stdin_once else (lambda: None))
        with self.lock:
            if stream in self.streams:
                self.streams.remove(stream)

    def kill(self) -> None:
        """The pod is deleted: every process it started dies (a runtime kills the container's whole cgroup;
        here its process tree, which `setsid` may have put in other sessions), and its stdin closes."""
        for pid in [self.proc.pid] + descendants(self.proc.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        _writer(self.proc)[1]()


def descendants(pid: int) -> List[int]:
    """Every live descendant of pid, from /proc/<pid>/task/*/children."""
    out: List[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir("/proc/%d/task" % parent)
        except OSError:
            continue
        for task in tasks:
            try:
                with open("/proc/%d/task/%s/children" % (parent, task)) as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out
