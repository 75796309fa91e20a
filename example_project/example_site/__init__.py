"""Settings, URLs and WSGI entry point of the django_jobs example project."""
