"""AppConfig of the shop app; django_jobs imports its jobs.py at startup."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop"
