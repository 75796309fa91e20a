"""A project that names JobsBackend in TASKS but forgot ``"django_jobs"`` in INSTALLED_APPS."""
