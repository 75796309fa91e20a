"""The watchman's decisions, without a process or a database."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from django_jobs.watchman import Watch, cpu_ticks, supported

pytestmark = pytest.mark.skipif(not supported(), reason="the watchman reads /proc (Linux)")


def starved_watch() -> Watch:
    watch = Watch(interval=1.0, stale=3.0, now=0.0)
    watch.pulsed("inf", now=0.0)
    watch.should_beat(100, now=0.5)  # the first reading: nothing to compare yet
    return watch


def test_no_beat_while_the_worker_pulses() -> None:
    watch = starved_watch()
    watch.pulsed("inf", now=1.0)
    assert not watch.should_beat(200, now=1.5)


def test_a_beat_once_pulses_stop_while_the_process_executes() -> None:
    watch = starved_watch()
    assert watch.should_beat(200, now=2.0)
    assert not watch.should_beat(300, now=2.5)  # at most one beat per interval
    assert watch.should_beat(400, now=3.0)


def test_no_beat_for_a_process_that_executes_nothing_or_is_stopped() -> None:
    watch = starved_watch()
    assert not watch.should_beat(100, now=2.0)  # CPU time did not advance: hung
    assert not watch.should_beat(None, now=3.0)  # stopped, a zombie, or gone
    assert not watch.should_beat(200, now=4.0)  # nothing to compare with after a gap


def test_no_beat_past_the_running_runs_timeouts() -> None:
    watch = Watch(interval=1.0, stale=3.0, now=0.0)
    watch.pulsed("2.0", now=0.0)  # the runs may take 2 s more: covered until 5 s
    watch.should_beat(100, now=0.5)
    assert watch.should_beat(200, now=4.0)
    assert not watch.should_beat(300, now=5.5)


def test_a_garbled_pulse_still_counts_as_a_pulse() -> None:
    watch = Watch(interval=1.0, stale=3.0, now=0.0)
    watch.pulsed("garbage", now=7.0)
    assert (watch.last_pulse, watch.cover_until) == (7.0, math.inf)


def test_cpu_ticks_of_a_live_a_stopped_and_a_gone_process() -> None:
    assert isinstance(cpu_ticks(os.getpid()), int)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert cpu_ticks(child.pid) is not None
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while cpu_ticks(child.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cpu_ticks(child.pid) is None
    finally:
        child.kill()
        child.wait()
    assert cpu_ticks(child.pid) is None
