from django.urls import path

from retention import views

app_name = "retention"

urlpatterns = [
    path("", views.policy_list, name="policy_list"),
    path("approvals/", views.approvals, name="approvals"),
    path("holds/", views.holds, name="holds"),
    path("holds/place/", views.hold_place, name="hold_place"),
    path("holds/<int:hold_id>/", views.hold_detail, name="hold_detail"),
    path("holds/<int:hold_id>/release/", views.hold_release_request, name="hold_release_request"),
    path(
        "holds/<int:hold_id>/approve-release/",
        views.hold_release_approve,
        name="hold_release_approve",
    ),
    path(
        "holds/<int:hold_id>/withdraw-release/",
        views.hold_release_withdraw,
        name="hold_release_withdraw",
    ),
    path(
        "holds/<int:hold_id>/refuse-release/", views.hold_release_refuse, name="hold_release_refuse"
    ),
    path("drafts/new/", views.policy_new, name="policy_new"),
    path("drafts/", views.version_create, name="version_create"),
    path("<slug:slug>/", views.policy_detail, name="policy_detail"),
    path("<slug:slug>/pause/", views.policy_pause, name="policy_pause"),
    path("<slug:slug>/resume/", views.policy_resume, name="policy_resume"),
    path("<slug:slug>/v<int:number>/", views.version_detail, name="version_detail"),
    path("<slug:slug>/v<int:number>/preview/", views.version_preview, name="version_preview"),
    path("<slug:slug>/v<int:number>/submit/", views.version_submit, name="version_submit"),
    path("<slug:slug>/v<int:number>/approve/", views.version_approve, name="version_approve"),
    path("<slug:slug>/v<int:number>/reject/", views.version_reject, name="version_reject"),
]
