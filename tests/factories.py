"""factory-boy factories for the job tables."""

from __future__ import annotations

import os
import socket
import uuid

import factory
from django.utils import timezone

from django_jobs.models import JobRun, JobStep, Status, Worker


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    hostname = factory.LazyFunction(socket.gethostname)
    pid = factory.LazyFunction(os.getpid)
    pools = factory.LazyFunction(lambda: ["default"])
    concurrency = 1


class JobRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobRun

    job_type = "tests.noop"
    pool = "default"
    input = factory.LazyFunction(dict)


class RunningJobRunFactory(JobRunFactory):
    """A run held by a worker under a lease, as right after a claim."""

    status = Status.RUNNING
    attempts = 1
    claimed_by = factory.SubFactory(WorkerFactory)
    lease_token = factory.LazyFunction(uuid.uuid4)
    started_at = factory.LazyFunction(timezone.now)


class JobStepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobStep

    run = factory.SubFactory(JobRunFactory)
    step_id = factory.Sequence(lambda n: f"step-{n}")
    seq = factory.Sequence(lambda n: n)
    status = JobStep.StepStatus.COMPLETED
    output = factory.LazyFunction(dict)
