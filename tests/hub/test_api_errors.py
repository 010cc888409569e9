"""How the API answers a database failure (`hub.api.error_answer`, used by ninja's error
handlers): 503, never a 2xx, with a sentence that says what happened and how to retry."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest
from django.db import OperationalError
from django.db.utils import DatabaseErrorWrapper
from psycopg_pool import PoolTimeout

from hub.api import DATABASE_DOWN_DETAIL, HUB_BUSY_DETAIL, error_answer


def _as_django_raises(error: Exception) -> OperationalError:
    """`error` as a PostgreSQL connection's code sees it: wrapped by Django's error wrapper."""
    postgresql = SimpleNamespace(Database=psycopg, errors_occurred=False)
    with pytest.raises(OperationalError) as caught, DatabaseErrorWrapper(postgresql):
        raise error
    return caught.value


def test_a_request_that_waited_too_long_for_a_pooled_connection_is_told_the_hub_is_busy() -> None:
    timed_out = _as_django_raises(PoolTimeout("couldn't get a connection after 10.00 sec"))

    status, body = error_answer(timed_out)

    assert (status, body["error"]) == (503, "unavailable")
    assert body["detail"] == HUB_BUSY_DETAIL
    assert "too busy" in body["detail"] and "idempotency_key" in body["detail"]


def test_a_database_that_went_away_is_called_unavailable() -> None:
    gone = _as_django_raises(psycopg.OperationalError("server closed the connection unexpectedly"))

    assert error_answer(gone) == (503, {"error": "unavailable", "detail": DATABASE_DOWN_DETAIL})
    assert error_answer(OperationalError("no cause")) == (
        503,
        {"error": "unavailable", "detail": DATABASE_DOWN_DETAIL},
    )


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_a_path_under_api_that_no_operation_serves_answers_the_json_error_shape(client, method) -> None:
    response = getattr(client, method)("/api/v1/no-such-thing")
    served = client.get("/api/v1/ping")  # an answer of one of the API's operations (401)

    assert response.status_code == 404
    assert response["Content-Type"] == served["Content-Type"] == "application/json; charset=utf-8"
    assert response.content == b'{"error":"not_found","detail":"There is nothing here."}'
