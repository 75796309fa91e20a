"""start_many() of any size, on every database: split where a server limits one
statement (MariaDB's and MySQL's max_allowed_packet), still one transaction."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection

from django_jobs import api, start_many
from django_jobs.models import JobRun
from django_jobs.storage import vendors

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_hundred_thousand_runs_in_one_call() -> None:
    runs = start_many("tests.echo", [{"i": i} for i in range(100_000)])
    assert len(runs) == 100_000
    assert [run.input["i"] for run in runs[::9_999]] == list(range(0, 100_000, 9_999))
    assert len({run.pk for run in runs}) == 100_000
    assert JobRun.objects.count() == 100_000


def test_a_split_call_writes_all_its_runs_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_BATCH_BYTES", 64 << 10)  # about 60 runs per statement
    vendor = type(vendors.of(connection))
    real = vendor.insert_runs
    calls: list[int] = []

    def failing_third(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise IntegrityError("refused")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(vendor, "insert_runs", failing_third)
    with pytest.raises(IntegrityError):
        start_many("tests.echo", [{"i": i} for i in range(1_000)])
    assert len(calls) == 3
    assert not JobRun.objects.exists()
    monkeypatch.setattr(vendor, "insert_runs", real)
    runs = start_many("tests.echo", [{"i": i} for i in range(1_000)])
    assert [run.input["i"] for run in runs] == list(range(1_000))
    assert JobRun.objects.count() == 1_000
