"""The admission guard: may a chunk start now, and if not, why?

Signals are measured from PostgreSQL itself by one sampler at a time (advisory
lock) and stored as ``GuardSample`` rows; workers read the latest sample
instead of each querying the catalog. Each signal has a per-policy threshold
(``[guard]`` in the policy), and a higher "critical" threshold at which the
policy is paused and an alert raised instead of just deferring the chunk.

The foreground probe is also judged against its own idle baseline (the p95 of the samples
taken while no chunk transaction of the product was in flight on the target), so CPU
contention that lifts a 1 ms probe to 10 ms counts even under the absolute threshold. That
relative pressure paces rather than stops: chunk transactions may fill at most the duty cycle
of recent wall time (docs/guard.md).

The latency controller (``control_step``) closes the loop: every period it compares the probe's
p99 since its last step with the idle baseline's p99 against the policy's inflation budget and
moves the knobs that cause the inflation — how many chunk transactions of the policy run at
once, the chunk's target duration and the duty cycle — down by half when over the budget and
a step back up towards the policy's own settings when under it (AIMD). Its state is a row per
policy (``GuardControl``, stepped under its row lock by whichever worker finds it due) and
each step is kept (``GuardControlStep``).

An external signal, a Prometheus query (runs.engine.prometheus), is read by the sampler
with the built-in signals and judged like them; no answer is pressure after a grace period.

The parts, one module per job: ``signals`` (reading the signals, the samples, the probe's
window and idle baseline), ``probe`` (the probe and its session), ``sampler`` (the thread that
samples and probes beside the chunks), ``verdict`` (evaluate, admission, pacing),
``controller`` (control_step, ceilings, clamping) and ``report`` (control_summary, run_budget,
current_state). This package re-exports the names the rest of the product uses."""

from __future__ import annotations

from runs.engine.guard.common import (
    IDLE_PROBES,
    controlled,
)
from runs.engine.guard.controller import (
    DECREASE,
    FLOOR,
    FOREGROUND,
    HOLD,
    INCREASE,
    QUIET,
    RESTART_AFTER_S,
    START,
    ceilings_of,
    control_step,
    floor_of,
    io_thresholds,
)
from runs.engine.guard.limit import Limit, budget_of, limit_of
from runs.engine.guard.probe import (
    PROBE_TIMEOUT_MS,
    _probe_connection,
    _probe_ms,
    close_probe_connection,
)
from runs.engine.guard.report import (
    control_of,
    control_summary,
    current_state,
    run_budget,
)
from runs.engine.guard.sampler import (
    SAMPLER_LINGER_S,
    sample_beside,
    stop_sampling_beside,
)
from runs.engine.guard.signals import (
    idle_baseline,
    latest_sample,
    probe_windows,
    sample,
)
from runs.engine.guard.verdict import (
    ADMIT,
    Verdict,
    admission,
    duty_cycle,
    evaluate,
    forget_readings,
    pause_after,
    target_chunk_ms,
)

__all__ = [
    "FOREGROUND",
    "floor_of",
    "io_thresholds",
    "Limit",
    "limit_of",
    "ADMIT",
    "DECREASE",
    "FLOOR",
    "HOLD",
    "IDLE_PROBES",
    "INCREASE",
    "PROBE_TIMEOUT_MS",
    "QUIET",
    "RESTART_AFTER_S",
    "SAMPLER_LINGER_S",
    "START",
    "Verdict",
    "_probe_connection",
    "_probe_ms",
    "admission",
    "budget_of",
    "ceilings_of",
    "close_probe_connection",
    "control_of",
    "control_step",
    "control_summary",
    "controlled",
    "current_state",
    "duty_cycle",
    "evaluate",
    "forget_readings",
    "idle_baseline",
    "latest_sample",
    "pause_after",
    "probe_windows",
    "run_budget",
    "sample",
    "sample_beside",
    "stop_sampling_beside",
    "target_chunk_ms",
]
