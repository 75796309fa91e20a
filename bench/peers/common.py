"""What every system's driver shares: databases, worker processes, the drain poller,
the latency probe, RSS, the foreign-load monitor, the io case's connection count and
the ratelimit case's figures.

A driver (``<system>_bench.py``) measures one case of one system in a fresh scratch
database and writes one JSON record; ``bench/run.py`` runs the drivers round by round.
The database server (PostgreSQL, or MariaDB with ``BENCH_DATABASE=mariadb``) is
reached through ``servers``, whose names are re-exported here.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import servers
from servers import (  # noqa: F401  (the drivers' names for them)
    DB_PREFIX,
    analyze,
    connect,
    drop_scratch_dbs,
    dsn,
    recreate_db,
    scalar,
    server_process,
    server_version,
    span_seconds,
    start_times,
    url,
)

POLL = 0.1  # seconds between two counts of finished runs
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- worker processes -------------------------------------------------------------


class Workers:
    """Worker processes, each the leader of its own process group.

    Their pids go to $BENCH_PIDFILE as they start, so that bench/run.py can stop them
    even if this driver dies; ``with Workers(...)`` stops them on the way out.
    """

    def __init__(self, name: str, cmds: list[list[str]], cwd: str, env: dict[str, str]):
        log_dir = os.environ.get("BENCH_LOG_DIR") or os.path.join(BENCH_DIR, "results", "logs")
        os.makedirs(log_dir, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[str] = []
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
        for i, cmd in enumerate(cmds):
            self.logs.append(os.path.join(log_dir, f"{name}_w{i}.log"))
            with open(self.logs[-1], "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=full_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.procs.append(proc)
            pidfile = os.environ.get("BENCH_PIDFILE")
            if pidfile:
                with open(pidfile, "a") as f:
                    f.write(f"{proc.pid}\n")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self, where: str) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker {proc.pid} exited with {proc.returncode} ({where}); see {log}"
                )

    def wait(self, timeout: float) -> None:
        """Wait for every worker to exit by itself (``--burst``); raise if one exits
        with an error or is still running after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs, strict=True):
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"worker {proc.pid} still running after {timeout:.0f} s"
                ) from None
            if code != 0:
                raise RuntimeError(f"worker {proc.pid} exited with {code}; see {log}")

    def stop(self, timeout: float = 15.0) -> None:
        stop_groups([p.pid for p in self.procs], timeout)
        for proc in self.procs:
            proc.wait()


def stop_groups(pgids: Sequence[int], timeout: float = 15.0) -> list[int]:
    """SIGTERM each process group that still has a live member, SIGKILL what is left
    after ``timeout``; returns the groups that had to be killed."""
    live = [g for g in pgids if _group_has_members(g)]
    for pgid in live:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = [g for g in live if _group_has_members(g)]
    for pgid in live:
        _signal_group(pgid, signal.SIGKILL)
    return live


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_has_members(pgid: int) -> bool:
    """True while a process of the group is alive (zombies do not count)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def rss_of_group(pgid: int) -> dict[str, Any]:
    """VmRSS / VmHWM (KiB) of the largest process of a worker's process group (the
    worker itself: ``manage.py`` runs it in-process, but a wrapper may sit above it)."""
    best: dict[str, Any] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except (OSError, ValueError, IndexError):
            continue
        rss = int(status.get("VmRSS", "0 kB").split()[0])
        if rss > best.get("rss_kb", -1):
            best = {"pid": int(entry), "rss_kb": rss, "hwm_kb": int(status["VmHWM"].split()[0])}
    if not best:
        raise RuntimeError(f"no live process in group {pgid}")
    return best


# --- measurements -----------------------------------------------------------------


def wait_drained(
    db: str,
    done_sql: str,
    n: int,
    workers: Workers,
    timeout: float | None = None,
    poll: float = POLL,
) -> dict[str, Any]:
    """Count finished runs every ``poll`` s until ``n`` are. Rate = runs finished after
    the first observed progress / time from that observation until all are finished."""
    timeout = timeout or max(300.0, n / 20)
    started = time.monotonic()
    first_t: float | None = None
    first_done = 0
    with connect(db) as conn:
        cur = conn.cursor()
        while True:
            now = time.monotonic()
            cur.execute(done_sql)
            done = int(cur.fetchone()[0])
            if first_t is None and done > 0:
                first_t, first_done = now, done
            if done >= n:
                break
            if now - started > timeout:
                raise TimeoutError(f"drain not finished after {timeout:.0f} s: {done}/{n}")
            workers.check_alive(f"{done}/{n} finished")
            time.sleep(poll)
    assert first_t is not None
    span = now - first_t
    return {
        "drain_per_s": round((n - first_done) / span, 1) if span > 0 else None,
        "drain_s": round(span, 3),
        "first_progress_s": round(first_t - started, 3),
        "done_at_first_progress": first_done,
    }


def wait_started(lat_file: str, enqueue_one: Callable[[str], object], timeout: float = 60) -> float:
    """Warm-up probe: one latency job, and wait until a worker has run it."""
    t = time.monotonic()
    enqueue_one("warmup")
    while time.monotonic() - t < timeout:
        if "warmup" in _read_marks(lat_file):
            return round(time.monotonic() - t, 3)
        time.sleep(0.01)
    raise TimeoutError("the workers did not run the warm-up probe")


def measure_latency(
    enqueue_one: Callable[[str], object], lat_file: str, samples: int, timeout: float = 15
) -> dict[str, Any]:
    """Idle enqueue-to-start latency: ``enqueue_one(tag)`` enqueues a job whose body
    appends ``"tag time.time()"`` to ``lat_file``; latency = that time minus
    time.time() just before the enqueue call. Random 0.2-0.8 s idle gaps."""
    lat_ms: list[float] = []
    call_ms: list[float] = []
    for i in range(samples):
        time.sleep(random.uniform(0.2, 0.8))
        tag = f"s{i}-{random.randrange(1 << 30)}"
        t = time.time()
        enqueue_one(tag)
        call_ms.append((time.time() - t) * 1000)
        while (mark := _read_marks(lat_file).get(tag)) is None:
            if time.time() - t > timeout:
                raise TimeoutError(f"latency probe {tag} not started after {timeout} s")
            time.sleep(0.002)
        lat_ms.append(round((mark - t) * 1000, 3))
    return {
        "lat_ms": lat_ms,
        "lat_p50_ms": round(statistics.median(lat_ms), 2),
        "lat_p90_ms": round(percentile(lat_ms, 90), 2),
        "enqueue_call_ms": round(statistics.median(call_ms), 3),
    }


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def _read_marks(lat_file: str) -> dict[str, float]:
    try:
        with open(lat_file) as f:
            return {tag: float(ts) for tag, ts in (line.split() for line in f if line.strip())}
    except FileNotFoundError:
        return {}


def fresh_file(path: str) -> str:
    if os.path.exists(path):
        os.remove(path)
    return path


class LoadMonitor:
    """CPU (in cores) used during a phase by processes that are not this benchmark's:
    "ours" = descendants of this driver and PostgreSQL backends of bench_run_*
    databases; "pg_aux" = PostgreSQL's own processes; "foreign" = everything else.
    On MariaDB the whole server process is "db_server" (``servers.server_process``),
    so other clients' queries are not in "foreign" there.
    Sampled every 0.5 s, so short-lived foreign processes are partly missed."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.root = os.getpid()
        self.totals = {"ours": 0, "pg_aux" if servers.POSTGRESQL else "db_server": 0, "foreign": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.result: dict[str, float] = {}

    def __enter__(self) -> LoadMonitor:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        seconds = max(time.monotonic() - self._t0, 1e-9) * os.sysconf("SC_CLK_TCK")
        self.result = {f"{k}_cores": round(v / seconds, 2) for k, v in self.totals.items()}

    def _loop(self) -> None:
        before = _cpu_by_process()
        while not self._stop.wait(self.interval):
            now = _cpu_by_process()
            for pid, (_, cpu, start, _) in now.items():
                prev = before.get(pid)
                used = cpu - prev[1] if prev and prev[2] == start else cpu
                if used > 0:
                    self.totals[self._classify(pid, now)] += used
            before = now

    def _classify(self, pid: int, procs: dict[int, tuple[int, int, int, str]]) -> str:
        server = server_process(procs[pid][3])
        if server is not None:
            return server
        for _ in range(64):
            if pid == self.root:
                return "ours"
            if pid not in procs:
                break
            pid = procs[pid][0]
        return "foreign"


def _cpu_by_process() -> dict[int, tuple[int, int, int, str]]:
    """pid -> (ppid, utime + stime in ticks, start time, command line)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        out[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19]), cmd)
    return out


# --- the io case ------------------------------------------------------------------

IO_SECONDS = 0.1  # what each run of the io case awaits (asyncio.sleep)
IO_POLL = 0.05  # its drain lasts about a second: count finished runs every 50 ms


def io_figures(n: int, concurrency: int, span: float | None) -> dict[str, Any]:
    """The io case's figures from its DB span: the ideal time at ``concurrency`` runs
    at once (ceil(n / C) waves of IO_SECONDS each) and span / ideal."""
    ideal = math.ceil(n / concurrency) * IO_SECONDS
    return {
        "io_concurrency": concurrency,
        "span_s": round(span, 3) if span else None,
        "ideal_s": round(ideal, 3),
        "span_over_ideal": round(span / ideal, 2) if span else None,
        "drain_db_per_s": round(n / span, 1) if span else None,
    }


class ConnectionSampler:
    """The most PostgreSQL sessions the worker processes held at once, sampled from
    ``pg_stat_activity`` every ``interval`` s by a thread of the driver.

    A session counts when its client end is a socket of a process of one of the
    workers' process groups. Each sample lists those processes' open sockets
    (``/proc/<pid>/fd``), finds in the TCP tables (``/proc/<pid>/net/tcp``, ``tcp6``)
    the local ports of the ones connected to the server's port, and counts the client
    backends of ``pg_stat_activity`` coming from this host (the sampler's own
    ``inet_client_addr()``) from those ports. So no system has to be configured for it
    (PgQueuer's asyncpg connection, Procrastinate's pool and Django's connections
    alike, whatever ``application_name`` each sets), every database the worker uses
    counts, and the driver's own connections (enqueue, drain poller, this sampler)
    do not, whatever their pids. ``max_sockets`` is the same count from the sockets
    alone, a cross-check. It needs TCP: with ``BENCH_PGHOST`` a socket directory
    there are no client ports, and the counts are None. With ``enabled`` false it
    samples nothing and its result is empty (the cases that do not count).
    """

    def __init__(self, pgids: Sequence[int], interval: float = 0.05, enabled: bool = True):
        self.enabled = enabled
        self.pgids = set(pgids)
        self.interval = interval
        self.port = int(servers.PGPORT)
        self.samples = 0
        self.max_sessions = 0
        self.max_sockets = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.result: dict[str, Any] = {}

    def __enter__(self) -> ConnectionSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        usable = self.samples and self.error is None
        self.result = {
            "max_connections": self.max_sessions if usable else None,
            "max_sockets": self.max_sockets if usable else None,
            "connection_samples": self.samples,
        }
        if self.error:
            self.result["connection_sampler_error"] = self.error

    def _loop(self) -> None:
        if not servers.POSTGRESQL or servers.PGHOST.startswith("/"):
            self.error = "PostgreSQL over TCP only"
            return
        try:
            with connect(None) as conn:
                cur = conn.cursor()
                members: list[int] = []
                listed = 0.0
                while not self._stop.is_set():
                    t = time.monotonic()
                    if t - listed >= 1.0:  # the groups' members: the worker, its children
                        members, listed = _group_members(self.pgids), t
                    ports = _server_ports(members, self.port)
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE backend_type = 'client backend'"
                        " AND client_addr IS NOT DISTINCT FROM inet_client_addr()"
                        " AND client_port = ANY(%s)",
                        [sorted(ports)],
                    )
                    sessions = int(cur.fetchone()[0])
                    self.samples += 1
                    self.max_sessions = max(self.max_sessions, sessions)
                    self.max_sockets = max(self.max_sockets, len(ports))
                    self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))
        except Exception as exc:  # the drain goes on; the record says why there is no count
            self.error = f"{type(exc).__name__}: {exc}"


def _group_members(pgids: set[int]) -> list[int]:
    """The live processes of the process groups ``pgids``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in pgids and fields[0] != "Z":
                members.append(int(entry))
    return members


def _server_ports(pids: Sequence[int], server_port: int) -> set[int]:
    """Local ports of the established TCP connections to ``server_port`` whose socket
    one of ``pids`` has open."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[int] = set()
    if not inodes:
        return ports
    for table in ("tcp", "tcp6"):
        # One network namespace: any of the processes' tables is the host's.
        with contextlib.suppress(OSError), open(f"/proc/{pids[0]}/net/{table}") as f:
            next(f)  # the header
            for line in f:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if (
                    state == "01"  # ESTABLISHED
                    and inode in inodes
                    and int(remote.rsplit(":", 1)[1], 16) == server_port
                ):
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


# --- the ratelimit case ---------------------------------------------------------


def most_in_any_second(starts: Sequence[float]) -> int:
    """The most of ``starts`` (seconds, in order) in any half-open second [t, t + 1):
    the busiest such second begins at a start. Counted in whole microseconds (the
    timestamps' resolution), so that float rounding moves no start across a bound."""
    us = [round(t * 1_000_000) for t in starts]
    return max((bisect.bisect_left(us, u + 1_000_000) - i for i, u in enumerate(us)), default=0)


def ratelimit_figures(n: int, rate: int, starts: Sequence[float]) -> dict[str, Any]:
    """The ratelimit case's figures from its runs' starts (seconds after the first, in
    order) under a limit of ``rate`` a second: the span from the first start to the
    last, the ideal (n - rate) / rate (the first ``rate`` at once, then ``rate`` a
    second), span / ideal, the most starts in any second (the limit: at most
    ``rate``; ``limit_violation`` says when it was not held) and the starts in each
    second [k, k + 1) after the first."""
    span = starts[-1] if starts else None
    ideal = (n - rate) / rate
    most = most_in_any_second(starts)
    by_second = [0] * (math.floor(span or 0) + 1)
    for instant in starts:
        by_second[math.floor(instant)] += 1
    figures: dict[str, Any] = {
        "rate": rate,
        "started": len(starts),
        "span_s": round(span, 3) if span is not None else None,
        "ideal_s": round(ideal, 3),
        "span_over_ideal": round(span / ideal, 3) if span is not None and ideal > 0 else None,
        "most_in_a_second": most,
        "starts_by_second": by_second,
    }
    if most > rate:
        figures["limit_violation"] = f"{most} starts in one second, over the limit of {rate}/s"
    return figures


# --- the driver's command line ----------------------------------------------------


def driver_main(measure: Callable[[argparse.Namespace], dict[str, Any]]) -> None:
    """Parse the options bench/run.py passes, measure one case, write one JSON record."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--concurrency", default="16", help="an integer, or 'default'")
    parser.add_argument("--lat-samples", type=int, default=25)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--rss-runs", type=int, default=100_000)
    parser.add_argument("--worker-verbosity", type=int, default=None)
    parser.add_argument("--io-concurrency", type=int, default=500)
    parser.add_argument("--ratelimit-rate", type=int, default=20)
    parser.add_argument("--ratelimit-workers", type=int, default=3)
    parser.add_argument("--held-runs", type=int, default=100_000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    record: dict[str, Any] = {"case": args.case, "n": args.n}
    try:
        record.update(measure(args))
    except BaseException as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-3000:]
    with open(args.out, "w") as f:
        json.dump(record, f)
    sys.exit(1 if "error" in record else 0)


if __name__ == "__main__":
    # Small helpers for bench/run.py, run with a benchmark venv's Python.
    if sys.argv[1:] == ["server-version"]:
        print(server_version())
    elif sys.argv[1:] == ["drop-scratch-dbs"]:
        print(" ".join(drop_scratch_dbs()))
    else:
        sys.exit("usage: common.py server-version | drop-scratch-dbs")
