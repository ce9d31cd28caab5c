"""bench_worker._wait_for_store: a rank connects its TCPStore client only once rank 0's store listens.

Real sockets on loopback: a listener that starts after the wait began, and a port nobody ever listens on.
"""

from __future__ import annotations

import socket
import threading

from tests.netports import free_port as _free_port  # a port of this worker's own block


def test_the_wait_ends_with_a_connection_to_a_store_that_started_late(worker):
    """The rank polls while nothing listens; the store's listener, once up, is what ends the wait."""
    port = _free_port()
    listening = threading.Event()
    started_polling = threading.Event()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    refused = []

    def late_store():
        started_polling.wait(30)
        server.bind(("127.0.0.1", port))
        server.listen(8)
        listening.set()

    real_sleep = worker.time.sleep

    def counting_sleep(seconds):  # each sleep follows a refused connect
        refused.append(seconds)
        started_polling.set()
        real_sleep(seconds)

    worker.time.sleep = counting_sleep
    thread = threading.Thread(target=late_store, daemon=True)
    thread.start()
    try:
        worker._wait_for_store("127.0.0.1", port, 60.0)
        assert listening.is_set(), "the wait ended before the store listened"
        assert refused and all(s == worker.STORE_POLL_S for s in refused)
        server.settimeout(10)
        conn, _ = server.accept()  # the poll's own connection reached the store, then closed
        conn.close()
    finally:
        worker.time.sleep = real_sleep
        thread.join(30)
        server.close()


def test_a_store_that_never_listens_ends_the_wait_at_its_deadline_without_raising(worker):
    """The TCPStore constructor, called next, reports the refusal in torch's words; the wait adds nothing."""
    port = _free_port()
    assert worker._wait_for_store("127.0.0.1", port, 0.3) is None


def test_a_listening_store_is_found_at_the_first_try(worker):
    """The healthy twin: the store is up before the rank looks, so no poll sleeps."""
    real_sleep = worker.time.sleep
    slept = []
    worker.time.sleep = slept.append
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        try:
            worker._wait_for_store("127.0.0.1", server.getsockname()[1], 30.0)
        finally:
            worker.time.sleep = real_sleep
    assert slept == []
