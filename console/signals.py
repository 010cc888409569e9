"""Console sockets follow the browser sessions that opened them (`console.consumers`): a logout
closes that session's sockets, and a change to a user (saved or deleted: staff or active status,
password) makes each of its sockets re-check its session."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save

from console.consumers import RECHECK_EVENT, SIGNED_OUT_EVENT, operator_group, session_digest
from messaging.services.events import announce


def _logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or request is None:
        return
    # Sent before the session is flushed, so the sockets are told which session ended rather
    # than asked to look.
    digest = session_digest(request.session.session_key)
    announce(SIGNED_OUT_EVENT, {"session": digest}, operators=False, groups=[operator_group(user.pk)])


def _user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    announce(RECHECK_EVENT, {}, operators=False, groups=[operator_group(instance.pk)])


def connect() -> None:
    """Register the receivers (from `ConsoleConfig.ready`)."""
    user_logged_out.connect(_logged_out, dispatch_uid="console.logged_out")
    user_model = get_user_model()
    post_save.connect(_user_changed, sender=user_model, dispatch_uid="console.user_saved")
    post_delete.connect(_user_changed, sender=user_model, dispatch_uid="console.user_deleted")
