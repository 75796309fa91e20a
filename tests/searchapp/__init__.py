"""A project's model indexed by modelsearch, a third-party app whose ``@task``
(imported from the django-tasks backport, as Wagtail does) keeps its search index
up to date: the suite runs that task on JobsBackend as it is."""
