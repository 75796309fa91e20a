"""The test settings in the test mode of RUN_ON_COMMIT: for the worker refused at start."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import DJANGO_JOBS

DJANGO_JOBS["RUN_ON_COMMIT"] = True
