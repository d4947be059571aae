from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from api.urls import urls as api_urls
from core import views as core_views
from runs.pages.views import home, metrics_view

urlpatterns = [
    path("", home, name="home"),
    path("healthz", core_views.healthz, name="healthz"),
    # a browser asks for /favicon.ico on a new session whatever the page links
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
        name="favicon",
    ),
    path("metrics", metrics_view, name="metrics"),
    path("login/", core_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("docs/<slug:name>/", core_views.doc, name="doc"),
    path("tokens/", core_views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", core_views.token_revoke, name="token_revoke"),
    path("policies/", include("retention.urls")),
    path("runs/", include("runs.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api_urls),
]
