"""What a page on another origin may make the operator's browser ask of the console.

A page on another port of the console's host is the same *site*, so SameSite=Lax sends the
operator's cookies with every request it makes the browser send, and a page anywhere sends them
with a link it follows. CSRF and the Origin check keep such pages from posting; this keeps their
GETs from acting in the operator's name. The browser names who asked in its Fetch Metadata
headers, which no page can set: `Sec-Fetch-Site` is `same-origin` for the console's own requests,
`none` for an address typed or bookmarked, `same-site` or `cross-site` for another page's.

From another page only a link to a console page is answered (an alert's link in a chat or an
e-mail): a top-level GET navigation, which the person sees open. Anything else it makes the
browser send (an `<img>`, a script, `fetch` with `no-cors`, a frame) is refused before the
session is read, so it neither reaches a view nor moves the login's idle expiry on; a view marked
`same_origin_only` (a download the audit records as the operator's) refuses even a link. A request
without these headers (curl, scripts, an older browser) is judged by the other checks alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseForbidden

View = TypeVar("View", bound=Callable[..., HttpResponseBase])

OWN_REQUEST = frozenset({"same-origin", "none"})
SAME_ORIGIN_ONLY = "switchboard_same_origin_only"


def same_origin_only(view: View) -> View:
    """Mark `view` as one that only the console's own pages (or an address typed) may open: it
    acts in the operator's name even on GET."""
    setattr(view, SAME_ORIGIN_ONLY, True)
    return view


def from_another_page(request: HttpRequest) -> bool:
    """Whether the browser says another page made this request (another port of this host counts)."""
    site = request.headers.get("Sec-Fetch-Site")
    return site is not None and site not in OWN_REQUEST


def _link_to_a_page(request: HttpRequest) -> bool:
    return (
        request.method in ("GET", "HEAD")
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and request.headers.get("Sec-Fetch-Dest") == "document"
    )


def _refused() -> HttpResponse:
    return HttpResponseForbidden(
        "Another page asked for this: the console answers such a request only as a link to one of "
        "its pages, opened by a person.",
        content_type="text/plain; charset=utf-8",
    )


class CrossSiteGuard:
    """Django middleware, placed before the session's: another page's request reaches the console
    only as a link to a page, and never a view marked `same_origin_only`."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if from_another_page(request) and not _link_to_a_page(request):
            return _refused()
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        if getattr(view, SAME_ORIGIN_ONLY, False) and from_another_page(request):
            return _refused()
        return None
