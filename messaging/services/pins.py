"""Removing a sender's pin: the one change to pins that is not a send's (a send writes them)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.models import Pin
from messaging.principals import Principal
from messaging.services.audit import audit_event


def pin_remove(*, pin_id: Any, actor: Principal) -> bool:
    """An operator removes one pin; False when it was already gone. The sender's next send to
    that name resolves it afresh and pins whoever holds the name then, so this is an operator's
    decision (a pin is what refuses a name taken over by another session), audited with the
    name and whom it pointed at."""
    actor.require_operator()
    with transaction.atomic():
        pin = Pin.objects.select_for_update().filter(pk=pin_id).first()
        if pin is None:
            return False
        pin.delete()
        audit_event(
            "pin.removed",
            actor=actor.actor,
            target=str(pin.sender_id),
            detail={"name_key": pin.name_key, "recipient": str(pin.recipient_id)},
        )
    return True
