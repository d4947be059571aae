"""The sampler beside the chunks: a thread in one draining process of the pool that takes the
guard's samples every sample interval and probes the foreground between them."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection

from core import locks, timeouts
from runs.engine.guard.common import (
    _rows,
    _targets,
    controlled,
)
from runs.engine.guard.probe import (
    _between,
    _probe,
    close_probe_connection,
)
from runs.engine.guard.signals import (
    sample,
)
from targets import connections as fleet_connections

log = logging.getLogger(__name__)


# -- the sampler beside the chunks -------------------------------------------------------

SAMPLER_LINGER_S = 5.0  # a process samples this long after its last drain loop asked it to

_beside_lock = threading.Lock()
_beside: dict = {"thread": None, "until": 0.0, "stop": threading.Event()}


def sample_beside(linger_s: float = SAMPLER_LINGER_S) -> None:
    """Keep a sampler thread in this process, on a connection of its own, for the next
    ``linger_s`` (``SAMPLER_LINGER_S``; a worker pausing longer under the duty cycle asks for
    its pause and that): each drain loop's turn calls this, so the thread lives as long as the
    process drains and a few seconds more. One such thread in the pool — the first to
    take the session lock ``locks.PROBER`` — takes the guard's samples every
    ``GUARD_SAMPLE_MS`` and probes the foreground between them every ``GUARD_PROBE_MS``; the
    threads of other processes stand by to take over when its process stops draining.

    A worker's own admission takes a sample between its chunks, never during one: with one
    chunk transaction at a time (the controller's floor) no probe would ever meet a chunk in
    flight, and the controller would read a foreground its chunks slow as idle. The thread's
    probes land wherever the foreground's requests land — in a chunk as often as the chunks
    fill the time — and the admission samples only when it finds no recent sample."""
    cfg = settings.RETENTION
    if not cfg.get("GUARD", True) or not cfg.get("GUARD_SAMPLER_THREAD", True):
        return
    if fleet_connections.current() != fleet_connections.DEFAULT:
        return  # one thread per process samples the control database; a target's drain
        # samples at its leases and admissions, on the target's own connection
    with _beside_lock:
        _beside["until"] = max(_beside["until"], time.monotonic() + linger_s)
        if _beside["thread"] is not None:
            return
        stop = _beside["stop"] = threading.Event()
        thread = threading.Thread(
            target=_sample_beside, args=(stop,), name="guard-sampler", daemon=True
        )
        _beside["thread"] = thread
    thread.start()


def _probe_between(specs: list) -> bool:
    """One probe of each controlled target between two samples, kept for this process's next
    sample (``probes``: [ms, epoch seconds]): the controller judges a period by a few dozen
    readings rather than the four its samples take — the highest of four follows the
    foreground's typical request, not the tail that its p99 is. One thread in the pool does
    this (``locks.PROBER``). False when a probe gave no reading (the thread then waits for its
    next sample rather than opening a session ten times a second)."""
    ok = True
    for spec in {s.qualified_table: s for s in specs if controlled(s)}.values():
        probe = _probe(spec)
        if probe is None:
            ok = False
            continue
        readings = _between.setdefault(spec.qualified_table, [])
        readings.append([round(probe[0], 3), round(time.time(), 3)])
        del readings[:-200]  # at most the latest 200 while no sample of this process is taken
    return ok


def stop_sampling_beside(timeout_s: float = 5.0) -> None:
    """Stop this process's sampler thread, if any, and wait for it (a test's end)."""
    with _beside_lock:
        thread = _beside["thread"]
        _beside["stop"].set()
    if thread is not None:
        thread.join(timeout_s)


def _backend_pid() -> int | None:
    """The server process of this thread's connection (None: not connected)."""
    raw = connection.connection
    return None if raw is None or raw.closed else raw.info.backend_pid


def _sample_beside(stop: threading.Event) -> None:
    cfg = settings.RETENTION
    every = cfg["GUARD_SAMPLE_MS"] / 1000
    tick = min(every, cfg["GUARD_PROBE_MS"] / 1000)
    sampled = tried = 0.0
    specs: list = []  # the targets of the last sample, probed between samples
    # the session that holds the pool's prober lock (a session lock: a new session after a
    # lost connection holds nothing, and takes it again only if no other thread has)
    prober: int | None = None
    try:
        while True:
            with _beside_lock:
                if stop.is_set() or time.monotonic() >= _beside["until"]:
                    _beside["thread"] = None
                    return
            t0 = time.monotonic()
            try:
                with timeouts.engine_session():
                    if prober is not None and prober != _backend_pid():
                        prober = None
                        _between.clear()
                    if prober is None and t0 - tried >= every:  # standing by: seldom
                        tried = t0
                        if _targets():
                            (got,) = _rows("SELECT pg_try_advisory_lock(%s, 0)", [locks.PROBER])[0]
                            prober = _backend_pid() if got else None
                    if prober is not None and t0 - sampled >= every:
                        # the runs draining now (that this session can see): read once a
                        # sample interval, not at every probe between samples
                        specs, sampled = _targets(), t0
                        if specs:
                            sample(by="sampler")
                    elif prober is not None and specs and not _probe_between(specs):
                        specs = []  # no reading: nothing more until the next sample
            except Exception:  # noqa: BLE001 - the admission samples by itself meanwhile
                log.warning("the guard's sampler thread failed a sample", exc_info=True)
                connection.close()  # the prober's lock goes with the session
                prober, specs = None, []
                _between.clear()
            stop.wait(max(0.005, tick - (time.monotonic() - t0)))
    finally:
        with _beside_lock:
            if _beside["thread"] is threading.current_thread():
                _beside["thread"] = None
        _between.clear()
        close_probe_connection()
        connection.close()  # this thread's own connection
