from django.urls import path

from retention import views

app_name = "retention"

urlpatterns = [
    path("", views.policy_list, name="policy_list"),
    path("holds/", views.holds, name="holds"),
    path("<slug:slug>/", views.policy_detail, name="policy_detail"),
]
