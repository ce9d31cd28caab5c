"""The mtu check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import re
import threading

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

COUNT = 3
#: seconds between a target's pings: 50 ms keeps three pings to 0.1 s. iputils before 20210202 refuses
#: intervals under 200 ms to users ("cannot flood; minimal interval allowed for user is 200ms"): the
#: probe then pings again at SLOW_INTERVAL.
INTERVAL = 0.05
SLOW_INTERVAL = 0.2
_MIN_INTERVAL = lazy(r"minimal interval allowed for user is", re.I)
MAX_PARALLEL = 32
#: seconds ping waits for the last reply (-W): the first try's, then the confirmation's
WAIT_S = 1
CONFIRM_WAIT_S = 2
#: seconds past ping's own schedule (count × interval + -W) before the probe stops waiting for it. ping ends on
#: that schedule whatever the network does, so one still running is a starved node (measured: 1,000 simulated
#: nodes on 2 cores, load above 1,000, missed a 6.6 s limit), not evidence about the path: "not tested".
PING_SLACK_S = 15.0
#: what every ping prints (its summary): compiled at import; the error lines' patterns on first use
_STATS = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received(?P<rest>[^\n]*)")
_LOSS = re.compile(r"(\d+(?:\.\d+)?)% packet loss")
_ERRORS = lazy(r"\+(\d+) errors")
_RTT = re.compile(r"(?:rtt|round-trip) min/avg/max(?:/mdev)? = ([\d.]+)/([\d.]+)/([\d.]+)")
#: iputils <= s20180629 prints "local error: Message too long, mtu=1500" (capitalised); s20190324 and later
#: "message too long, mtu=1500" (IPv4) and "message too long, mtu: 1500" (IPv6, ping6_common.c).
_LOCAL_MTU = lazy(r"local error: message too long, mtu(?:=|: )(\d+)", re.I)
_TOO_LONG = lazy(r"message too long", re.I)
_FRAG = lazy(r"Frag(?:mentation)? needed and DF set \(mtu = (\d+)\)")
_PROG_ERROR = lazy(r"^\S*ping\S*: (.+)$", re.M)


def _ping_error(text: str, stdout: str, stderr: str) -> Tuple[Optional[str], bool, Optional[int]]:
    """(first error ping reported, refused for its size?, reported path MTU) from ping's output."""
    m = _LOCAL_MTU.search(text)
    if m:
        return "message too long, mtu=%s" % m.group(1), True, int(m.group(1))
    m = _FRAG.search(text)
    if m:
        return "fragmentation needed (mtu = %s)" % m.group(1), True, int(m.group(1))
    if _TOO_LONG.search(text):
        return "message too long", True, None
    if "Destination Host Unreachable" in text:
        return "destination host unreachable", False, None
    if "Destination Net Unreachable" in text:
        return "destination net unreachable", False, None
    m = _PROG_ERROR.search(stderr) or _PROG_ERROR.search(stdout)
    return (m.group(1).strip() if m else None), False, None


def no_reply(error: str, too_long: bool = False, path_mtu: Optional[int] = None) -> Dict[str, Any]:
    """The facts of a ping that got no statistics line: nothing sent or received, and why."""
    return {
        "transmitted": 0,
        "received": 0,
        "loss_pct": 100.0,
        "rtt_ms": None,
        "errors": 0,
        "error": error,
        "too_long": too_long,
        "path_mtu": path_mtu,
    }


def parse_ping(stdout: str, stderr: str = "", rc: Optional[int] = None) -> Dict[str, Any]:
    """iputils ping output → {transmitted, received, loss_pct, rtt_ms, errors, error, too_long, path_mtu}.

    error is the first problem ping reported (None when every packet came back); too_long is True when
    the packet was refused for its size rather than lost (EMSGSIZE locally, or a router's
    fragmentation-needed); path_mtu is the MTU the sender's kernel or a router reported for the path
    ('local error: message too long, mtu=1500', 'Frag needed and DF set (mtu = 1500)'), else None.
    """
    text = (stdout or "") + "\n" + (stderr or "")
    stats = _STATS.search(text)
    rtt = _RTT.search(text)
    error, too_long, path_mtu = _ping_error(text, stdout or "", stderr or "")
    if stats is None:
        if error is None:
            raise ParseError("ping output has no statistics line and no error: %.120r" % text.strip())
        return no_reply(error, too_long, path_mtu)
    transmitted, received = int(stats.group(1)), int(stats.group(2))
    loss = _LOSS.search(stats.group("rest"))
    if loss is None:
        raise ParseError("ping statistics line without packet loss: %.120r" % stats.group(0))
    errors = _ERRORS.search(stats.group("rest"))
    if error is None and received < transmitted:
        error = "%d of %d replies lost" % (transmitted - received, transmitted)
    return {
        "transmitted": transmitted,
        "received": received,
        "loss_pct": float(loss.group(1)),
        "rtt_ms": float(rtt.group(2)) if rtt else None,
        "errors": int(errors.group(1)) if errors else 0,
        "error": error,
        "too_long": too_long,
        "path_mtu": path_mtu,
    }


def ping_argv(iface: str, size: int, target: str, count: int = COUNT, interval: float = INTERVAL,
              wait: int = WAIT_S) -> List[str]:
    """The ping command: DF set, fixed payload, bound to the interface. An argv list, never a shell line."""
    return [
        "ping",
        "-M",
        "do",
        "-s",
        str(int(size)),
        "-c",
        str(int(count)),
        "-i",
        "%g" % interval,
        "-W",
        str(int(wait)),
        "-I",
        iface,
        target,
    ]


def _ping(ctx: Any, cfg: Dict[str, Any], size: int, target: str, interval: float = INTERVAL,
          wait: int = WAIT_S) -> Dict[str, Any]:
    count = int(cfg.get("count", COUNT))
    timeout = count * max(interval, SLOW_INTERVAL) + wait + PING_SLACK_S
    res = ctx.run(ping_argv(cfg["iface"], size, target, count, interval, wait), timeout=timeout)
    if res.rc == 127:
        raise RuntimeError("ping is not installed (install iputils-ping)")
    if res.rc != 0 and interval < SLOW_INTERVAL and _MIN_INTERVAL.search(res.stderr):  # an older iputils, run by a user
        interval = SLOW_INTERVAL
        res = ctx.run(ping_argv(cfg["iface"], size, target, count, interval, wait), timeout=timeout)
    bound = cfg["iface"]
    if "SO_BINDTODEVICE" in res.stderr and "not permitted" in res.stderr and cfg.get("source_ip"):
        # Old kernels refuse SO_BINDTODEVICE to unprivileged users: bind the source address instead.
        bound = cfg["source_ip"]
        res = ctx.run(ping_argv(bound, size, target, count, interval, wait), timeout=timeout)
    if res.timed_out:
        out = no_reply("ping did not finish within %gs" % timeout)
        out["unfinished"] = True
        return out
    out = parse_ping(res.stdout, res.stderr, res.rc)
    out["bound"] = bound
    return out


def _ping_confirmed(ctx: Any, cfg: Dict[str, Any], size: int, target: str) -> Dict[str, Any]:
    """One ping; one that got no reply at all (and was not refused for its size) is sent again, slower and
    waiting longer, before the path is judged on it: three packets lost in 0.1 s on a busy moment must not
    drain a node, while a black hole loses these too. The second try decides; the first is kept under
    "first_try"."""
    first = _ping(ctx, cfg, size, target)
    if first["received"] > 0 or first["too_long"] or first["path_mtu"] is not None:
        return first
    need = int(cfg.get("count", COUNT)) * SLOW_INTERVAL + CONFIRM_WAIT_S + 0.5
    left = ctx.remaining()
    if left is not None and left < need:  # a --timeout too short for it: the first try stands, and says so
        first["error"] = "%s; no second try (%.1f s of the probe's time left)" % (first["error"], max(left, 0.0))
        return first
    again = _ping(ctx, cfg, size, target, SLOW_INTERVAL, CONFIRM_WAIT_S)
    again["first_try"] = {"loss_pct": first["loss_pct"], "error": first["error"]}
    return again


def _in_threads(calls: List[Tuple[Any, Tuple[Any, ...]]], width: int) -> List[Any]:
    """[fn(*args) for fn, args in calls], run by at most `width` plain daemon threads; the first exception a call
    raised is raised here. Not concurrent.futures: its import, with the logging it loads, cost each node's
    phase 2 more CPU than its pings."""
    results: List[Any] = [None] * len(calls)
    errors: List[BaseException] = []
    todo = list(range(len(calls)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                results[i] = calls[i][0](*calls[i][1])
            except BaseException as exc:  # raised again below, in the probe's thread
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, min(width, len(calls))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def probe(ctx: Any) -> Dict[str, Any]:
    """Ping every target with a full-size DF packet and a small one, concurrently; a ping that got no reply
    is confirmed by a second, slower one."""
    cfg = ctx.config
    if cfg.get("skip"):
        return {"skipped": cfg["skip"]}
    for key in ("iface", "size", "small_size", "targets"):
        if key not in cfg:
            raise ValueError("mtu probe config lacks %r (the plan did not run?)" % key)
    targets = cfg["targets"]
    pings = []
    for t in targets:
        pings.append((_ping_confirmed, (ctx, cfg, int(cfg["size"]), t["ip"])))
        pings.append((_ping_confirmed, (ctx, cfg, int(cfg["small_size"]), t["ip"])))
    done = _in_threads(pings, MAX_PARALLEL)
    results = []
    for i, t in enumerate(targets):
        big, small = done[2 * i], done[2 * i + 1]
        result = {
            "peer": t["peer"],
            "ip": t["ip"],
            "size": int(cfg["size"]),
            "small_size": int(cfg["small_size"]),
            "jumbo_ok": big["received"] > 0,
            "small_ok": small["received"] > 0,
            "loss_pct": big["loss_pct"],
            "small_loss_pct": small["loss_pct"],
            "rtt_ms": big["rtt_ms"],
            "error": big["error"],
            "small_error": small["error"],
            "too_long": big["too_long"],
            "path_mtu": big["path_mtu"],
        }
        for key, ping in (("", big), ("small_", small)):
            if ping.get("unfinished"):
                result[key + "unfinished"] = True
            if ping.get("first_try"):
                result[key + "first_try"] = ping["first_try"]
        results.append(result)
    return {"iface": cfg["iface"], "mtu": cfg.get("mtu"), "targets": results}
