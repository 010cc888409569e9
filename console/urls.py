"""The operator console's pages (mounted at the root by `hub.urls`, namespace `console`)."""

from django.urls import path

from console import alert_views, export_views, views

console_patterns = [
    path("", views.dashboard, name="dashboard"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("holds/", views.holds, name="holds"),
    path("holds/decide", views.holds_decide_view, name="holds-decide"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("sessions/<uuid:session_id>/policy", views.session_policy, name="session-policy"),
    path(
        "sessions/<uuid:session_id>/sender-policy", views.session_sender_policy, name="session-sender-policy"
    ),
    path("sessions/<uuid:session_id>/end", views.session_end, name="session-end"),
    path("sessions/<uuid:session_id>/export", export_views.session_pair_export, name="session-export"),
    path("teams/<uuid:team_id>/", views.team_detail, name="team"),
    path("teams/<uuid:team_id>/export", export_views.team_export, name="team-export"),
    path("teams/<uuid:team_id>/conversation/", views.team_conversation, name="team-conversation"),
    path("conversations/<uuid:a>/<uuid:b>/", views.conversation_pair, name="conversation"),
    path("messages/<uuid:message_id>/", views.message_detail, name="message"),
    path("messages/<uuid:message_id>/reveal", views.message_reveal_view, name="message-reveal"),
    path("audit/", views.audit, name="audit"),
    path("peers/", views.peers, name="peers"),
    path("peers/pin", views.peer_pin_new, name="peer-pin-new"),
    path("peers/<int:peer_id>/pin", views.peer_pin_existing, name="peer-pin"),
    path("peers/<int:peer_id>/revoke", views.peer_revoke_view, name="peer-revoke"),
    path("peers/<int:peer_id>/restore", views.peer_restore_view, name="peer-restore"),
    path("console/updates", views.updates, name="updates"),
    *alert_views.urlpatterns,
    path("console/attention", views.attention_view, name="attention"),
]
