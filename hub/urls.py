"""The hub's URLs: health checks, the admin, the REST API, static files, and the console's pages."""

from django.contrib import admin
from django.contrib.staticfiles.views import serve as static_serve
from django.urls import include, path, re_path

from console.urls import console_patterns
from hub import health
from hub.api import api, no_such_path

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    re_path(r"^api/", no_such_path),  # after the API's own paths: the rest of /api/ answers JSON
    # One process serves its own CSS and script (and the admin's): there is no front proxy in the
    # embedded footprint. Production may put `collectstatic` output behind a web server instead.
    path("static/<path:path>", static_serve, {"insecure": True}),
    # Browsers ask for /favicon.ico on every page whatever the page links.
    path("favicon.ico", static_serve, {"path": "console/favicon.ico", "insecure": True}),
    path("", include((console_patterns, "console"))),
]
