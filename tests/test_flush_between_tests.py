"""The test suite's flush between transactional tests leaves every table empty."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.core.management.color import no_style
from django.db import connection

from messaging.models import UnreadCount


@pytest.mark.django_db(transaction=True)
def test_the_flush_between_transactional_tests_empties_every_table(register: Any, send: Any) -> None:
    alice = register("alice")
    register("bob")
    send(alice, "bob", "unread")  # a delivery, and its trigger's unread-count row
    assert UnreadCount.objects.exists()
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))
    left = {m._meta.db_table: m.objects.count() for m in apps.get_models() if m._meta.db_table in tables}
    assert {table: n for table, n in left.items() if n} == {}
