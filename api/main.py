"""The API object: ``/api/v1/``, its routers, its errors and its throttle. The schema it
serves (``/api/v1/openapi.json``) is checked in as ``api/openapi.json``; regenerate it with
``manage.py export_openapi_schema --api api.main.api --indent 1 --sorted --output api/openapi.json``
(a test keeps the two equal). Both need a token or a signed-in person holding a role, unless
``API_PUBLIC_SCHEMA`` publishes them."""

from __future__ import annotations

from django.conf import settings
from ninja import NinjaAPI, Swagger
from ninja.throttling import AuthRateThrottle

from . import audit, errors, floors, holds, people, policies, runs, targets
from .auth import schema_readers_only

api = NinjaAPI(
    title="Retention Runner API",
    version="1",
    description=(
        "Every operation of the command line and the pages, as typed JSON. Authenticate with a "
        "personal API token (`Authorization: Bearer rrt_…`, dashboard → API tokens); the token "
        'acts as its owner, with the owner\'s roles now. Errors are `{"code", "message"}` '
        "with a stable code. A GET of a run, a hold, a version or the kill switch answers with "
        "an `ETag`; send it back as `If-Match` and a decision made on a state that moved on is "
        "refused (412 `stale_state`). See docs/api.md."
    ),
    urls_namespace="api",
    docs_decorator=schema_readers_only,
    # no deep links: Swagger UI puts each operation's link inside its summary's button
    # (a control nested in a control, which a screen reader cannot reach)
    docs=Swagger(settings={"deepLinking": False}),
    throttle=[AuthRateThrottle(settings.API_THROTTLE_RATE)],
)
errors.install(api)
for module in (policies, holds, floors, runs, audit, people, targets):
    api.add_router("", module.router)
