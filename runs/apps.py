from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_schedules(sender, **kwargs) -> None:
    # django-q2's Schedule model: importable once the app registry is ready
    from runs.engine.schedules import ensure_system_schedules

    ensure_system_schedules()


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs and audit"

    def ready(self) -> None:
        # the app registry is ready only now: runs' modules use the models at import
        from retention import signals
        from runs import actions, counts
        from runs.engine import payloads
        from runs.evidence import audit

        # a cluster runs only the product's own entry points, whoever signed the message
        payloads.install()
        post_migrate.connect(_ensure_schedules, sender=self)
        # retention's decisions and preview reach the runs through these (imports go one way)
        signals.policy_decided.connect(
            actions.follow_policy_decision, dispatch_uid="runs.follow_policy_decision"
        )
        if audit.measured_rate not in signals.preview_rate_sources:
            signals.preview_rate_sources.append(audit.measured_rate)
        if counts.rollout_report not in signals.rollout_sources:
            signals.rollout_sources.append(counts.rollout_report)
