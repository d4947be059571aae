from django.urls import path

from runs.pages import views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("trigger/", views.trigger, name="trigger"),
    path("<int:run_id>/pause/", views.run_action, {"action": "pause"}, name="pause"),
    path("<int:run_id>/resume/", views.run_action, {"action": "resume"}, name="resume"),
    path("<int:run_id>/cancel/", views.run_action, {"action": "cancel"}, name="cancel"),
    path("<int:run_id>/confirm/", views.run_action, {"action": "confirm"}, name="confirm"),
    path("<int:run_id>/retry/", views.run_action, {"action": "retry"}, name="retry"),
    path("<int:run_id>/manifest.json", views.run_manifest, name="manifest"),
    path("periods/<slug:slug>/manifest.json", views.period_manifest, name="period_manifest"),
    path("dead-letters/", views.dead_letters, name="dead_letters"),
    path("dead-letters/bulk/", views.dead_letters_bulk, name="dead_letters_bulk"),
    path(
        "dead-letters/<int:letter_id>/replay/",
        views.dead_letter_action,
        {"action": "replay"},
        name="replay",
    ),
    path(
        "dead-letters/<int:letter_id>/discard/",
        views.dead_letter_action,
        {"action": "discard"},
        name="discard",
    ),
    path("kill-switch/", views.kill_switch, name="kill_switch"),
    path("audit/", views.audit, name="audit"),
    path("audit/export.csv", views.audit_export, name="audit_export"),
    path("activity/", views.activity, name="activity"),
    path("targets/", views.targets, name="targets"),
    path("fleet/<slug:slug>/", views.policy_fleet, name="policy_fleet"),
    path("targets/<str:name>/", views.target, name="target"),
]
