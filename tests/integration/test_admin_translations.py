"""The admin in French: every page of django_jobs renders in the user's language.

Each page is rendered with French active and checked both ways: French strings
of django_jobs' catalog appear, and the English of the key ones does not.
(tests/unit/test_translations.py checks that the catalog covers every string.)
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from django_jobs.models import JobPool, JobRateLimit, JobRun, JobSchedule, Status
from tests.factories import JobRunFactory, JobStepFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

NB = "\u00a0"  # French puts a no-break space before : ; ? !
Q = "\u2019"  # and writes its apostrophe so


@pytest.fixture(autouse=True)
def french() -> Iterator[None]:
    with translation.override("fr"):
        yield


@pytest.fixture
def client(admin_client: Client) -> Client:
    return admin_client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def assert_french(content: str, french: list[str], english: list[str]) -> None:
    assert [text for text in french if text not in content] == []
    # Between tags, so that a CSS class or a URL naming the same word does not count.
    assert [text for text in english if f">{text}<" in content or f" {text}<" in content] == []


def failed_run() -> JobRun:
    now = timezone.now()
    parent = JobRunFactory(job_type="shop.order", status=Status.WAITING, awaiting=[1])
    run = JobRunFactory(
        job_type="shop.charge",
        tenant_id="acme",
        status=Status.FAILED,
        attempts=2,
        max_attempts=2,
        parent=parent,
        root=parent,
        claimed_by=WorkerFactory(hostname="w1", pid=7),
        created_at=now - timedelta(minutes=10),
        started_at=now - timedelta(seconds=5),
        finished_at=now,
        progress={"done": 1, "total": 3, "message": "charging", "at": now.isoformat()},
        error={
            "type": "shop.Declined",
            "message": "card declined",
            "traceback": "Traceback (most recent call last):\nshop.Declined: card declined",
            "attempt": 2,
            "retryable": False,
        },
    )
    JobStepFactory(run=run, step_id="reserve", output={"ok": True})
    JobStepFactory(run=run, step_id="charge", status="failed", output=None, error=run.error)
    return run


def test_the_run_list(client: Client) -> None:
    failed_run()
    RunningJobRunFactory(progress={"done": 2, "total": 4, "message": "copying"})
    JobRunFactory(status=Status.PENDING)
    content = page(client, reverse("admin:django_jobs_jobrun_changelist"))
    assert_french(
        content,
        [
            "Exécutions de tâches",  # Django's "Select %s to view", with our verbose name
            "Type de tâche",
            "Statut",
            "Tentatives",
            "Création",
            "Durée",
            "Échouée",
            "En cours",
            "En attente",
            "Par statut",  # Django's "By %s", with our filter title
            "Par type de tâche",
            "Par locataire",
            "Relancer les exécutions sélectionnées",
            "Lancer maintenant les exécutions en attente sélectionnées",
            "correspondances exactes",
            ">Pools<",
            f"jusqu{Q}ici",
        ],
        [
            "Job runs",
            "Job type",
            "Status",
            "Attempts",
            "Created",
            "Duration",
            "Failed",
            "Running",
            "Pending",
            "By status",
            "By job type",
            "By tenant",
            "Retry selected runs",
            "Cancel selected runs",
            "Run selected pending runs now",
        ],
    )
    assert "exact matches" not in content
    assert "so far" not in content


def test_the_run_page(client: Client) -> None:
    run = failed_run()
    content = page(client, reverse("admin:django_jobs_jobrun_change", args=[run.pk]))
    assert_french(
        content,
        [
            "Résumé",
            "2 sur 2",
            "tentative 2, non relançable",
            f"<summary>trace d{Q}appels</summary>",
            "10,0" + NB + "min de la création à la fin · dernier lancement 5,0" + NB + "s",
            "(a exécuté sa dernière tentative)",
            f"(son dernier rapport, avant la fin de l{Q}exécution)",
            "Chronologie",
            "Données",
            "Étapes",
            "Famille",
            "Entrée",
            "Sortie",
            "Racine",
            "Enfants",
            "Déclencheur",
            "Workers par tentative",
            "Politique de fermeture",
            "Clé de concurrence",
            "Jeton de bail",
            "Échéance",
            "<th>étape</th>",
            "<th>sortie / erreur</th>",
            "Terminée",
            "Relancer",
            "créée le",
            "terminée le",
        ],
        [
            "Summary",
            "Times",
            "Data",
            "Steps",
            "Family",
            "Input",
            "Output",
            "Children",
            "Trigger",
            "Workers by attempt",
            "Close policy",
            "Concurrency key",
            "Lease token",
            "Run at",
            "step",
            "output / error",
            "Completed",
            "Retry",
            "traceback",
        ],
    )
    for english in ["of 2", "not retryable", "from creation to end", "ran its last attempt"]:
        assert english not in content


def test_a_pending_and_a_running_run(client: Client) -> None:
    due = JobRunFactory(status=Status.PENDING, run_at=timezone.now() + timedelta(hours=1))
    content = page(client, reverse("admin:django_jobs_jobrun_change", args=[due.pk]))
    assert "prévue le" in content
    assert "due " not in content
    running = RunningJobRunFactory(progress={"done": 2, "total": 4, "message": "copying"})
    content = page(client, reverse("admin:django_jobs_jobrun_change", args=[running.pk]))
    assert f"la détient en ce moment{NB}; état du worker{NB}: en cours" in content
    assert "holds it now" not in content


def test_many_steps_are_paged_in_french(client: Client) -> None:
    run = JobRunFactory(status=Status.COMPLETED)
    JobStepFactory.create_batch(51, run=run)
    content = page(client, reverse("admin:django_jobs_jobrun_change", args=[run.pk]))
    assert "étapes 1 à 50 sur 51" in content
    assert ">étapes suivantes</a>" in content


def test_an_operation_asks_and_reports_in_french(client: Client) -> None:
    run = failed_run()
    url = reverse("admin:django_jobs_jobrun_retry", args=[run.pk])
    content = page(client, url)
    assert_french(
        content,
        [
            f"Relancer{NB}: êtes-vous sûr{NB}?",
            f"Relancer 1 exécution{NB}:",
            "repassent en attente avec de nouvelles tentatives",
            f"Réinitialiser les étapes{NB}: les étapes terminées s{Q}exécutent à nouveau",
            "Non, revenir à la page précédente",
            "Accueil",
        ],
        ["Home", "No, take me back"],
    )
    assert "are you sure" not in content
    done = client.post(url, {"confirm": "yes"}, follow=True).content.decode()
    assert f"Relancer{NB}: 1 exécution modifiée, ignorées{NB}: 0." in done
    # The history is a stored record: written in English whoever acted (docs/admin.md).
    entry = LogEntry.objects.get(object_id=str(run.pk))
    assert entry.get_change_message() == "Retry via the admin"


def test_the_bulk_confirmation_in_french(client: Client) -> None:
    runs = [failed_run(), JobRunFactory(status=Status.COMPLETED)]
    data = {"action": "cancel_runs", "_selected_action": [r.pk for r in runs], "index": 0}
    content = client.post(reverse("admin:django_jobs_jobrun_changelist"), data).content.decode()
    assert f"Annuler 2 exécutions{NB}:" in content
    assert "En cascade" in content
    assert "Cancel 2 runs" not in content


def test_the_pools_page(client: Client) -> None:
    JobRunFactory(pool="mail", status=Status.PENDING, run_at=timezone.now() - timedelta(minutes=3))
    JobPool.objects.create(name="slow", paused_at=timezone.now(), pause_reason="audit")
    JobRunFactory(pool="slow")
    content = page(client, reverse("admin:django_jobs_jobrun_pools"))
    assert_french(
        content,
        [
            "portent sur les 5 dernières minutes",
            f"Un pool en pause continue d{Q}accepter des exécutions",
            "<th>état</th>",
            "<th>plus ancienne en attente</th>",
            "<th>exécutions/min</th>",
            "<th>workers actifs</th>",
            "<strong>en pause</strong> depuis",
            "actif",
            ">Reprendre</button>",
            ">Mettre en pause</button>",
            'placeholder="motif (facultatif)"',
            "min</td>",
        ],
        ["state", "pending", "oldest due pending", "runs/min", "Resume", "Pause"],
    )
    assert "Finished runs" not in content


def test_rate_limited_runs_on_the_pools_page(client: Client, settings: Any) -> None:
    settings.DJANGO_JOBS = {"RATE_LIMITS": {"ratelimited": "100/m"}}
    for _ in range(3):
        JobRunFactory(job_type="tests.limited", pool="ratelimited")
    JobRateLimit.objects.create(  # closed under tests.limited's own rate, 20/s
        scope="job",
        name="tests.limited",
        limit=20,
        period=1.0,
        open_at=timezone.now() + timedelta(minutes=5),
    )
    content = page(client, reverse("admin:django_jobs_jobrun_pools"))
    assert "(3 retenues par la limite de débit)" in content
    assert "limite 100/m" in content
    assert "rate-limited)" not in content


def test_pausing_a_pool_reports_in_french(client: Client) -> None:
    url = reverse("admin:django_jobs_jobrun_pools")
    done = client.post(url, {"pool": "mail", "operation": "pause"}, follow=True)
    assert f"Pool &#x27;mail&#x27; en pause{NB}: les workers cessent" in done.content.decode()


def test_the_workers_pages(client: Client) -> None:
    worker = WorkerFactory(hostname="w1", pid=7)
    listed = page(client, reverse("admin:django_jobs_worker_changelist"))
    assert_french(
        listed,
        ["Concurrence", "Âge du signal de vie", "Démarré le", "Par statut", "En cours"],
        ["Concurrency", "Heartbeat age", "Started at", "By status", "Running"],
    )
    shown = page(client, reverse("admin:django_jobs_worker_change", args=[worker.pk]))
    assert_french(
        shown,
        [f"Nom d{Q}hôte", "Identifiant de processus", "Exécutions en cours"],
        ["Hostname", "Pid", "Running runs"],
    )


def test_the_schedules_pages(client: Client) -> None:
    schedule = JobSchedule.objects.create(
        name="nightly", job_type="tests.noop", cron="0 3 * * *", timezone="UTC", missed="skip"
    )
    listed = page(client, reverse("admin:django_jobs_jobschedule_changelist"))
    assert_french(
        listed,
        ["Planifications de tâches", "Fuseau horaire", "Dernier déclenchement", "Origine"],
        ["Job schedules", "Timezone", "Last tick", "Next tick", "Source", "Declared"],
    )
    shown = page(client, reverse("admin:django_jobs_jobschedule_change", args=[schedule.pk]))
    assert_french(
        shown, ["Date de création", "Origine", "code, plus déclarée"], ["Created at", "Source"]
    )
    added = page(client, reverse("admin:django_jobs_jobschedule_add"))
    assert_french(added, ["Type de tâche", "En pause", "Cinq champs"], ["Job type", "Paused"])


def test_english_stays_the_default(client: Client) -> None:
    JobRunFactory()
    with translation.override("en"):
        content = page(client, reverse("admin:django_jobs_jobrun_changelist"))
    assert "Job type</a>" in content
    assert "Relancer" not in content
