"""The Celery worker's consumer when Redis dies under it with a task unacknowledged.

A socket delivery's task runs with acks_late, so while it runs its message is unacknowledged. If
Redis dies then, Celery 5.7 + kombu 5.7 fail while tearing the lost connection down and the worker
stops consuming for good (issue 8: socket deliveries never re-driven after a Redis restart). These
tests rebuild what a worker has open on a private redis-server, kill it, and run the consumer's
connection-loss handler."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery.concurrency.prefork import _is_ack_callback
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Exchange, Queue
from kombu import Consumer as KombuConsumer
from kombu.message import Message

from hub.celery import Consumer, app
from tests.integration.harness import RedisServer


@pytest.fixture
def lost_connection(tmp_path: Path) -> Iterator[tuple[Connection, Message]]:
    """A broker connection as a busy worker holds it, whose Redis has just been killed: the task
    channel has one message received and not acknowledged, with its next BRPOP in flight, and a
    second channel consumes an auto-delete fanout queue (the worker's remote control). Yields the
    connection and the unacknowledged message."""
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server")
    server = RedisServer(tmp_path).start()
    connection = Connection(server.url())
    try:
        tasks = Queue("celery", Exchange("celery"), "celery")
        with connection.Producer() as producer:
            producer.publish({"task": "x"}, exchange=tasks.exchange, routing_key="celery", declare=[tasks])
        received = []
        KombuConsumer(
            connection.default_channel, [tasks], callbacks=[lambda _b, m: received.append(m)]
        ).consume()
        connection.drain_events(timeout=5)
        assert len(received) == 1, "the task message was not received"
        connection.default_channel._brpop_start()
        control = Queue("celery.pidbox", Exchange("celery.pidbox", type="fanout"), auto_delete=True)
        KombuConsumer(connection.channel(), [control], callbacks=[lambda _b, _m: None]).consume()
        server.stop()
        yield connection, received[0]
    finally:
        server.stop()


def _consumer(cls: type[CeleryConsumer], connection: Connection) -> CeleryConsumer:
    """Just what the connection-loss handler reads, without starting a worker."""
    consumer = cls.__new__(cls)
    consumer.app = app
    consumer.connection = connection
    consumer.qos_global = None
    consumer.pool = SimpleNamespace(num_processes=2)
    consumer.prefetch_multiplier = 1
    consumer.hub = SimpleNamespace(call_soon=lambda p: p())  # the event loop runs the ack at once
    return consumer


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_the_worker_consumer_survives_losing_redis_with_a_task_unacknowledged(lost_connection):
    # Given a worker's consumer whose Redis died while a task was unacknowledged
    connection, message = lost_connection
    consumer = _consumer(Consumer, connection)

    # When it handles the lost connection (before reconnecting), then it does not raise
    consumer.on_connection_error_after_connected(ConnectionError("Connection closed by server."))

    # And it let go of the lost connection, ready to connect again
    assert consumer.connection is None

    # And when the task that was running finishes, its ack (on the lost channel) does not raise
    # either, and leaves the message unacknowledged for the broker to redeliver
    consumer.call_soon_ack(message.ack_log_error, logging.getLogger("test"), connection.connection_errors)
    assert message.delivery_tag in message.channel.qos._delivered


def test_a_task_s_ack_is_one_celery_runs_while_the_pool_is_joined():
    # Given a worker's consumer with an event loop that queues callbacks
    queued = []
    consumer = Consumer.__new__(Consumer)
    consumer.hub = SimpleNamespace(call_soon=queued.append)
    message = Message(body=b"{}", channel=SimpleNamespace(), delivery_tag=1)

    # When a task finishes and the consumer queues its ack and, for another, a reject
    consumer.call_soon_ack(message.ack_log_error, logging.getLogger("test"), ())
    consumer.call_soon_ack(message.reject_log_error, logging.getLogger("test"), ())

    # Then both are callbacks Celery's warm shutdown runs while it joins the pool (anything else
    # waits for the join to end, and an acks_late task's message stays unacknowledged until then)
    assert [_is_ack_callback(callback) for callback in queued] == [True, True]


# Canaries, the reasons hub.celery.Consumer exists: if one starts failing after upgrading Celery
# or kombu, that upstream bug is fixed and its half of the subclass can go.


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_celery_s_own_consumer_fails_handling_the_lost_connection(lost_connection):
    connection, _ = lost_connection
    consumer = _consumer(CeleryConsumer, connection)
    with pytest.raises(AttributeError, match="hostname"):
        consumer.on_connection_error_after_connected(ConnectionError("Connection closed by server."))


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_celery_s_own_ack_fails_on_the_lost_channel(lost_connection):
    connection, message = lost_connection
    consumer = _consumer(Consumer, connection)
    consumer.on_connection_error_after_connected(ConnectionError("Connection closed by server."))
    del message.channel.basic_ack  # the lost channel's own ack, as it is without the marking
    with pytest.raises(AttributeError, match="client"):
        CeleryConsumer.call_soon_ack(
            consumer, message.ack_log_error, logging.getLogger("test"), connection.connection_errors
        )


@pytest.mark.django_db
def test_a_job_whose_broker_is_unreachable_is_left_to_the_sweepers(
    settings, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    # Given Celery jobs, and a broker that stays unreachable through kombu's publish retries
    from kombu.exceptions import OperationalError

    from messaging import jobs

    settings.SWITCHBOARD_JOBS = "celery"
    task = jobs._task("messaging.tasks.deliver_to_socket")
    started = []

    def unreachable(**kwargs):
        started.append(kwargs)
        raise OperationalError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    monkeypatch.setattr(task, "apply_async", unreachable)

    # When a service starts a socket write and its transaction commits
    with django_capture_on_commit_callbacks(execute=True):
        jobs.enqueue("messaging.tasks.deliver_to_socket", 42)

    # Then the publish was tried, and the failure is logged instead of raised into the request
    assert started == [{"args": (42,)}]
    assert "left to the sweepers" in caplog.text
