"""The worker's arithmetic for its event loop's claims, without a database."""

from __future__ import annotations

import pytest

from django_jobs.claimer import MAX_LOOP_BATCH, batch_size
from django_jobs.worker import JobWorker


@pytest.mark.parametrize(
    ("free", "size"),
    [(1, 1), (3, 2), (63, 32), (64, 64), (100, 64), (500, 448), (512, 512), (5000, 512)],
)
def test_claims_for_the_loop_come_in_a_few_sizes(free: int, size: int) -> None:
    assert batch_size(free) == size


def test_every_size_is_at_most_what_is_free_and_there_are_few() -> None:
    sizes = {batch_size(free) for free in range(1, 10_001)}
    assert all(batch_size(free) <= free for free in range(1, 2000))
    assert max(sizes) == MAX_LOOP_BATCH
    assert len(sizes) <= 16  # so, at most as many claim statements prepared


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"async_concurrency": -1}, "async_concurrency must be at least 0"),
        ({"database_threads": 0}, "database_threads must be at least 1"),
    ],
)
def test_bad_async_options_are_refused(options: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobWorker(["default"], **options)
