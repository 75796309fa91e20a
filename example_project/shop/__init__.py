"""A toy shop whose orders are fulfilled, receipted and booked by django_jobs runs."""
