from django.urls import path

from runs import views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("dead-letters/", views.dead_letters, name="dead_letters"),
    path("audit/", views.audit, name="audit"),
    path("activity/", views.activity, name="activity"),
]
