"""The migrations of django_jobs before they were squashed into 0001_initial (tests only)."""
