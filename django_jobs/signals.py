"""Signals sent on run and step transitions. The sender is always ``JobRun``.

Every run signal has the keyword arguments ``run_id``, ``job_type`` and ``attempt``;
``step_completed`` has ``step_id`` and ``output`` instead of ``attempt``;
``run_failed`` and ``run_retry_scheduled`` also have ``exception``, the error
that failed the attempt.
``event_sent`` has ``run_id``, ``job_type``, ``name`` and ``event_id``, sent
in the sender's process once its transaction commits; ``event_consumed`` has
``run_id``, ``job_type``, ``name``, ``event_id`` and ``step_id`` (the wait's record).
Receivers run in the worker thread that made the transition, after it was
written; an exception in a receiver is logged, never fails the run.
"""

from django.dispatch import Signal

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_retry_scheduled = Signal()
run_canceled = Signal()
run_timed_out = Signal()
step_completed = Signal()
event_sent = Signal()
event_consumed = Signal()
