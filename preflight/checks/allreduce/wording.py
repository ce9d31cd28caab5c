"""How a failed all-reduce is told: the stage it stopped at, the ranks and nodes that did not finish, and why.

Pure, over the agents' result documents (preflight.probe.bench_agent). The allreduce check turns the
message and the implicated nodes into findings; the localization reads the same stage positions.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.checks.allreduce.nccllog import NET_FAULTS
from preflight.common import MiB, fold, fold_ints, human_bytes


def ranks_phrase(ranks: Sequence[int], node_of: Mapping[int, str]) -> str:
    """'rank 3 (n004)' / 'ranks 0-7 (n[001-002])'."""
    nodes = [node_of[r] for r in ranks if r in node_of]
    word = "rank" if len(set(ranks)) == 1 else "ranks"
    where = " (%s)" % fold(nodes) if nodes else ""
    return "%s %s%s" % (word, fold_ints(ranks), where)


def doc_problem(doc: Any) -> Optional[str]:
    if doc is None:
        return None
    if isinstance(doc, dict) and "probe_error" in doc:
        return "bench agent failed: %s" % doc["probe_error"]
    if isinstance(doc, dict) and doc.get("error"):
        return "bench agent: %s" % doc["error"]
    return None


def position(entry: Mapping[str, Any], sizes: Sequence[int]) -> int:
    """How far a rank got: -1 at init, i at sizes[i], len(sizes) at teardown."""
    stage = entry.get("stage")
    if stage == "init":
        return -1
    if stage == "size" and entry.get("bytes") in sizes:
        return list(sizes).index(entry["bytes"])
    return len(sizes)


def stage_name(entry: Mapping[str, Any]) -> str:
    if entry.get("stage") == "size" and entry.get("bytes") is not None:
        return human_bytes(int(entry["bytes"]))
    if entry.get("stage") == "finish":
        return "teardown"
    return "init"


def _deadline_of(entry: Mapping[str, Any], doc: Mapping[str, Any], meta: Mapping[str, Any]) -> Optional[float]:
    fired = doc.get("deadline") or {}
    if fired.get("limit_s") is not None:
        return float(fired["limit_s"])
    deadlines = meta.get("deadlines") or {}
    key = "init_s" if entry.get("stage") == "init" else "op_s"
    return deadlines.get(key)


def cut_phrase(cut: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> str:
    last = human_bytes(points[-1]["bytes"]) if points else "the first size"
    return "sweep stopped before %s: %s took %.2f s on the slowest rank, so %s would take about %.1f s " \
        "(over its %g s budget)" % (human_bytes(int(cut["bytes"])), last, float(cut.get("took_s") or 0),
                                   human_bytes(int(cut["bytes"])), float(cut.get("projected_s") or 0),
                                   float(cut.get("budget_s") or 0))


#: a rank stopped at another preflight run's store (bench_worker's run id check)
OTHER_RUN = "belongs to another preflight run"
#: rank 0's store could not bind the rendezvous port (torch: "... name: EADDRINUSE, message: address
#: already in use"; older: "Address already in use")
_PORT_TAKEN = re.compile(r"EADDRINUSE|address already in use", re.I)


def contention(docs: Mapping[str, Any], meta: Mapping[str, Any]) -> Optional[str]:
    """Why the run could not take place because something else held its rendezvous, or None.

    Another preflight run on this machine holds the nodes (meta["held"]), another run holds the port on
    the store's node (an agent's "busy" document), ranks reached another preflight run's store, or rank
    0's store found the port taken at bind time: none of these says anything about a node's health, so
    the caller judges no node and says to retest.
    """
    held = meta.get("held") or {}
    if held:  # the controller's claim on the nodes (preflight.checks.allreduce.stage)
        pids = sorted({str(h.get("pid")) for h in held.values() if h.get("pid")})
        return ("all-reduce not run: another preflight run on this machine%s is testing %s right now; retest "
                "when it has finished" % (" (pid %s)" % ", ".join(pids) if pids else "", fold(list(held))))
    port = str(meta.get("master") or "").rpartition(":")[2] or "the rendezvous port"
    for node, doc in sorted(docs.items()):
        if isinstance(doc, dict) and doc.get("busy") is not None:
            busy = doc["busy"]
            who = "another preflight run"
            if busy.get("pid"):
                who += " (pid %s, uid %s)" % (busy["pid"], busy.get("uid"))
            return ("all-reduce not run: port %s on %s is in use by %s; retest when it has finished" % (
                busy.get("port") or port, node, who))
    entries = [(node, e) for node, doc in sorted(docs.items()) if isinstance(doc, dict)
               for e in doc.get("ranks") or [] if e.get("status") == "error" and e.get("stage") == "init"]
    strays = sorted({node for node, e in entries if OTHER_RUN in str(e.get("error") or "")})
    if strays:
        return ("all-reduce not run: the ranks of %s reached another preflight run's store at %s and stopped "
                "there; retest when that run has finished" % (fold(strays), meta.get("master") or "the rendezvous"))
    taken = sorted({node for node, e in entries if int(e.get("rank", -1)) == 0 and e.get("step") == "store"
                    and _PORT_TAKEN.search(str(e.get("error") or ""))})
    if taken:
        return ("all-reduce not run: port %s on %s was taken when rank 0's store bound it (EADDRINUSE): "
                "another program started listening there after the ports check; retest, or pass another "
                "--master-port" % (port, fold(taken)))
    return None


def explain_failure(meta, docs, missing, table, bad, node_of, points, data, world) -> Tuple[str, Dict[str, str]]:
    """(the cluster message, {implicated node: why}) for a run that hung or failed: the stage, the ranks
    and nodes that did not finish. Nodes that sent no result (missing) are not in the mapping: the caller
    names them already. Adds stopped_at, failed_ranks and implicated to data."""
    sizes = sorted({int(b) for d in docs.values() for b in d.get("sizes") or []} |
                   {int(s["bytes"]) for _n, e in table.values() for s in e.get("sizes") or []} |
                   {int(e["bytes"]) for _n, e in bad.values() if e.get("bytes") is not None})
    master = meta.get("master") or _master(docs)
    parts: List[str] = []
    implicated: Dict[str, str] = {}

    if bad:
        # Where the collective stopped: the least advanced rank that did not finish.
        stopped = min(position(e, sizes) for _n, e in bad.values())
        head = sorted(r for r, (_n, e) in bad.items() if position(e, sizes) == stopped)
        first_node, first = bad[head[0]]
        stage = stage_name(first)
        data["stopped_at"] = {"stage": first.get("stage"), "bytes": first.get("bytes")}
        errors = {r: ne for r, ne in bad.items() if ne[1].get("status") == "error"}
        stopped_ranks = {r: ne for r, ne in bad.items() if ne[1].get("status") == "timeout"}
        if missing and errors and all(peer_error(e) for _n, e in errors.values()):
            # a node vanished mid-run (its agent sent nothing: the node died, or its connection did) and
            # the ranks that lost their connection to it report it: they are its victims, not a cause
            parts.append(_vanished_message(bad, errors, sizes, node_of))
        elif errors and stopped_ranks and all(peer_error(e) for _n, e in errors.values()):
            # a rank stopped at its deadline and its peers lost their connection to it: a stall, which the
            # ranks that report the reset did not cause
            parts.append(_stall_message(stopped_ranks, errors, sizes, node_of, docs, meta))
        elif errors:
            parts.append(_error_message(errors, bad, sizes, node_of, implicated))
        elif stopped == -1:
            limit = _deadline_of(first, docs.get(first_node) or {}, meta)
            within = " within %g s" % limit if limit else ""
            parts.append(_init_message(head, bad, _arrived(docs), world, node_of, master, within, implicated))
        else:
            limit = _deadline_of(first, docs.get(first_node) or {}, meta)
            within = " within %g s" % limit if limit else ""
            text = "all-reduce hung at %s: %s did not finish%s" % (stage, ranks_phrase(head, node_of), within)
            ahead = sorted(r for r in table if r not in head)
            if ahead:
                text += " (%s got past it)" % ranks_phrase(ahead, node_of)
                for r in head:
                    implicated.setdefault(node_of[r], "rank %d did not finish the %s all-reduce%s" % (r, stage, within))
            elif not missing:
                done = [p["bytes"] for p in points if p["bytes"] < (first.get("bytes") or 0)]
                if done and (first.get("bytes") or 0) <= MiB:
                    text += ("; sizes up to %s completed: small messages pass and larger ones hang, the "
                             "signature of an MTU mismatch on the path (jumbo frames dropped)" % human_bytes(max(done)))
                text += "; every rank was stuck, so no node stands out: the pair localization below names the node"
            parts.append(text)

    if missing:
        missing_ranks = sorted(r for r, n in node_of.items() if n in missing and r not in table)
        text = "no result from %s" % fold(missing)
        if missing_ranks:
            text += " (%s %s)" % ("rank" if len(missing_ranks) == 1 else "ranks", fold_ints(missing_ranks))
        if not parts:
            text = "all-reduce incomplete: " + text
        parts.append(text)

    faults = network_faults(docs)
    if faults:
        first = faults[sorted(faults)[0]]
        parts.append("NCCL on %s reported network faults (\"%s\"): the path between the nodes failed, not the "
                     "GPUs: check the interface NCCL chose, routes, firewalls and the links" % (fold(faults), first[0]))
        data["nccl_net_faults"] = faults

    data["failed_ranks"] = sorted(bad)
    data["implicated"] = sorted(set(implicated) | set(missing))
    return "; ".join(parts), {name: why for name, why in implicated.items() if name not in missing}


def network_faults(docs: Mapping[str, Any]) -> Dict[str, List[str]]:
    """{node: up to 3 lines of its ranks' NCCL logs that show the network failing} (nccllog.NET_FAULTS:
    "Call to connect returned Connection timed out, retrying" is NCCL's socket layer failing to reach a
    peer at INFO level, evidence of a network fault rather than noise)."""
    out: Dict[str, List[str]] = {}
    for node, doc in docs.items():
        for entry in (doc or {}).get("ranks") or []:
            for line in str(entry.get("nccl_log") or "").splitlines():
                if "NCCL " in line and any(f in line for f in NET_FAULTS):
                    text = line.split(" NCCL ", 1)[1].split(" ", 1)[-1].strip()[:200]
                    lines = out.setdefault(node, [])
                    if text not in lines and len(lines) < 3:
                        lines.append(text)
    return out


PEER_ERROR = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|Connection refused|"
                         r"Socket Timeout|recv.*timed out|NCCL communicator was aborted", re.I)


def peer_error(entry: Mapping[str, Any]) -> bool:
    """True when a rank's error says only that a peer went away (the cause is elsewhere)."""
    return bool(PEER_ERROR.search(str(entry.get("error") or "")))


def _stall_message(stopped, errors, sizes, node_of, docs, meta) -> str:
    at = min(position(e, sizes) for _n, e in stopped.values())
    lead = sorted(r for r, (_n, e) in stopped.items() if position(e, sizes) == at)
    node, first = stopped[lead[0]]
    limit = _deadline_of(first, docs.get(node) or {}, meta)
    sample = errors[sorted(errors)[0]][1].get("error") or ""
    return ("all-reduce stalled at %s: %s made no progress within the %s deadline and %s stopped; %s then lost "
            "the connection (%s). Every rank was still in the collective, so no node stands out: a slow or "
            "lossy link stalls the whole ring; the rounds below name it" % (
                stage_name(first), ranks_phrase(lead, node_of), "%g s op" % limit if limit else "op",
                "was" if len(lead) == 1 else "were", ranks_phrase(sorted(errors), node_of), sample[:160]))


def _vanished_message(bad, errors, sizes, node_of) -> str:
    at = min(position(e, sizes) for _n, e in errors.values())
    first = next(e for _r, (_n, e) in sorted(errors.items()) if position(e, sizes) == at)
    return "all-reduce failed at %s: %s lost the connection to a node that vanished mid-run (%s)" % (
        stage_name(first), ranks_phrase(sorted(bad), node_of), str(first.get("error") or "")[:160])


#: init's steps in order: a rank that failed importing torch failed before peers that then lost it at
#: the store or while forming the group
_INIT_STEPS = {"import": 0, "store": 1, "group": 2}


def _error_message(errors, bad, sizes, node_of, implicated) -> str:
    """The failure at the earliest point (init: the earliest step), led by ranks whose process died and
    by errors that are not a peer's disappearance (peers report the cause's death, not the cause)."""
    died = {r: ne for r, ne in errors.items() if str(ne[1].get("error", "")).startswith("rank process")}
    first = died or errors
    first = {r: ne for r, ne in first.items() if not peer_error(ne[1])} or first

    def depth(entry: Mapping[str, Any]) -> Tuple[int, int]:
        at = position(entry, sizes)
        return at, _INIT_STEPS.get(entry.get("step"), len(_INIT_STEPS)) if at == -1 else 0

    at = min(depth(e) for _n, e in first.values())
    lead = sorted(r for r, (_n, e) in first.items() if depth(e) == at)
    sample = first[lead[0]][1]
    error = sample.get("error") or "error"
    text = "all-reduce failed at %s: %s: %s" % (stage_name(sample), ranks_phrase(lead, node_of), error)
    others = sorted(set(bad) - set(lead))
    if others:
        text += "; %s stopped too" % ranks_phrase(others, node_of)
    if "No module named 'torch'" in error:
        text += " (install torch in the interpreter named by python: on those nodes)"
    for r in lead:
        implicated.setdefault(node_of[r], "rank %d failed at %s: %s" % (r, stage_name(sample), error))
    return text


def _init_message(head, bad, arrived, world, node_of, master, within, implicated) -> str:
    at = " at %s" % master if master else ""
    if arrived is not None:
        absent = sorted(r for r in range(world) if r not in set(arrived))
        if absent:
            for r in absent:
                implicated.setdefault(node_of.get(r, "?"), "rank %d never reached the rendezvous%s" % (r, at))
            implicated.pop("?", None)
            return "all-reduce hung at init: %s never reached the rendezvous%s%s" % (
                ranks_phrase(absent, node_of), at, within)
    steps = {bad[r][1].get("step") for r in head}
    ranks = sorted(r for r, (_n, e) in bad.items() if e.get("stage") == "init")
    if steps == {"import"}:
        return "all-reduce hung at init: %s still importing torch%s (slow shared filesystem?)" % (
            ranks_phrase(ranks, node_of), within)
    if "store" in steps:
        store_ranks = sorted(r for r, (_n, e) in bad.items() if e.get("step") == "store")
        return "all-reduce hung at init: %s could not connect to the rendezvous store%s%s" % (
            ranks_phrase(store_ranks, node_of), at, within)
    return ("all-reduce hung at init: %s reached the rendezvous but the process group did not form%s "
            "(ranks cannot connect to each other: check GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME and firewalls)"
            % (ranks_phrase(ranks, node_of), within))


def _arrived(docs) -> Optional[List[int]]:
    for doc in docs.values():
        rv = doc.get("rendezvous") or {}
        if rv.get("arrived") is not None:
            return [int(r) for r in rv["arrived"]]
    return None


def _master(docs) -> Optional[str]:
    for doc in docs.values():
        rv = doc.get("rendezvous") or {}
        if rv.get("addr"):
            return "%s:%s" % (rv["addr"], rv.get("port"))
    return None
