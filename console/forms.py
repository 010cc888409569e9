"""Forms of the operator console. They parse and validate input; the services decide."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm

POLICY_CHOICES = [
    ("", "none (the default by permission mode)"),
    ("accept", "accept"),
    ("hold", "hold for an operator"),
    ("refuse", "refuse"),
]
MAX_BULK = 1000


class OperatorLoginForm(AuthenticationForm):
    """The console login: a valid password is not enough, the account must be staff (an operator)."""

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise forms.ValidationError(
                "This account is not an operator. Ask an operator to make it staff.", code="not_operator"
            )


class HoldDecisionForm(forms.Form):
    """Approve or deny one or many holds, with an optional reason."""

    action = forms.ChoiceField(choices=[("approve", "approve"), ("deny", "deny")])
    reason = forms.CharField(max_length=500, required=False, strip=True)

    def __init__(self, data: Any = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.delivery_ids: list[int] = []
        self._raw_ids = data.getlist("delivery_ids") if data is not None and hasattr(data, "getlist") else []

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        ids: list[int] = []
        for raw in self._raw_ids:
            try:
                ids.append(int(raw))
            except (TypeError, ValueError):
                raise forms.ValidationError("Hold ids are whole numbers.", code="bad_id") from None
        if not ids:
            raise forms.ValidationError("Select at least one held message.", code="empty")
        if len(ids) > MAX_BULK:
            raise forms.ValidationError(f"Decide at most {MAX_BULK} holds at a time.", code="too_many")
        self.delivery_ids = sorted(set(ids))
        return cleaned

    @property
    def approve(self) -> bool:
        return self.cleaned_data["action"] == "approve"


class PolicyForm(forms.Form):
    """An operator's inbound policy for one session (its floor) and how long its holds wait."""

    policy = forms.ChoiceField(choices=POLICY_CHOICES, required=False, label="Operator's floor")
    hold_expiry_seconds = forms.IntegerField(
        required=False, min_value=1, max_value=7 * 24 * 3600, label="Holds expire after (seconds)"
    )

    def clean_policy(self) -> str | None:
        return self.cleaned_data.get("policy") or None


class EndSessionForm(forms.Form):
    """An operator ends a session (its token stops working), having said they mean it."""

    confirm = forms.BooleanField(
        required=True, label="End it: its token stops working and what waits for it expires"
    )


class SenderPolicyForm(forms.Form):
    """An operator's rule for messages from one sender to this session."""

    sender = forms.UUIDField(label="Sender")
    action = forms.ChoiceField(
        choices=[("", "clear (use the general policy)"), *POLICY_CHOICES[1:]], required=False, label="Action"
    )

    def clean_action(self) -> str | None:
        return self.cleaned_data.get("action") or None


class PeerPinForm(forms.Form):
    """An operator vouches for a hub key before (or after) first contact."""

    public_key = forms.CharField(max_length=64, strip=True, label="Public key (base64 Ed25519)")
    name = forms.CharField(max_length=128, required=False, strip=True, label="Hub name")
    url = forms.CharField(max_length=512, required=False, strip=True, label="URL (for the LAN tier)")
    tier = forms.ChoiceField(
        choices=[("lan", "LAN"), ("channel", "channel"), ("relay", "relay")], initial="lan", label="Tier"
    )


class PeerRevokeForm(forms.Form):
    """Revoke a peer hub: refuse its messages, or hold them for an operator with escalate=required."""

    mode = forms.ChoiceField(
        choices=[("refuse", "refuse its messages"), ("hold", "hold them (escalate=required)")],
        label="Then",
    )
