"""Channel, Port and PortReceiver; @endpoint(explicit_response_port=True); send() with a port
(API.md "Results", "Endpoints and adverbs")."""

from __future__ import annotations

import pickle
import time

import pytest

from podium.actor import (
    Actor,
    ActorError,
    Channel,
    Port,
    PortReceiver,
    SupervisionError,
    current_rank,
    endpoint,
    send,
)

T = 10  # seconds: bound on every get() below


class Sender(Actor):
    @endpoint
    def send_range(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send((current_rank().rank, i))

    @endpoint
    def fail_port(self, port: Port, message: str) -> None:
        port.exception(KeyError(message))

    @endpoint
    def double(self, x: int) -> int:
        return 2 * x

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")


class Replier(Actor):
    """Endpoints that answer through an explicit response port."""

    def __init__(self) -> None:
        self.after_reply = []

    @endpoint(explicit_response_port=True)
    def twice(self, port: Port, x: int) -> None:
        port.send(2 * x)
        self.after_reply.append(x)  # runs after the answer is on its way

    @endpoint(explicit_response_port=True)
    def refuse(self, port: Port, why: str) -> None:
        port.exception(PermissionError(why))

    @endpoint(explicit_response_port=True)
    def raises(self, port: Port) -> None:
        raise ValueError("raised instead of answering")

    @endpoint(explicit_response_port=True)
    def who(self, port: Port) -> None:
        port.send(current_rank().rank)

    @endpoint
    def seen(self) -> list:
        return self.after_reply


def test_channel_send_and_recv_in_the_controller():
    port, receiver = Channel.open()
    assert isinstance(port, Port) and isinstance(receiver, PortReceiver)
    first = receiver.recv()  # a recv before the send resolves once the value arrives
    for i in range(100):
        port.send(i)  # fire and forget
    assert first.get(timeout=T) == 0
    assert [receiver.recv().get(timeout=T) for _ in range(99)] == list(range(1, 100))
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.05)  # nothing more was sent


def test_port_exception_makes_the_receiver_raise_it():
    port, receiver = Channel.open()
    port.send("ok")
    port.exception(KeyError("nope"))
    assert receiver.recv().get(timeout=T) == "ok"
    with pytest.raises(KeyError, match="nope"):
        receiver.recv().get(timeout=T)
    with pytest.raises(TypeError):
        port.exception("not an exception")


def test_a_port_passed_to_actors_delivers_in_order_per_sender(spawn):
    mesh = spawn(Sender)
    port, receiver = Channel.open()
    mesh.send_range.call(port, 200).get(timeout=T)
    got = [receiver.recv().get(timeout=T) for _ in range(400)]
    for rank in (0, 1):
        assert [i for r, i in got if r == rank] == list(range(200))  # send order per sender


def test_a_port_exception_sent_by_an_actor(spawn):
    one = spawn(Sender).slice(gpus=0)
    port, receiver = Channel.open()
    one.fail_port.broadcast(port, "from the actor")
    with pytest.raises(KeyError, match="from the actor"):
        receiver.recv().get(timeout=T)


def test_ports_pickle_and_once_ports_close_after_one_message():
    port, receiver = Channel.open(once=True)
    again = pickle.loads(pickle.dumps(port))
    again.send("first")
    assert receiver.recv().get(timeout=T) == "first"
    port.send("second")  # the port is closed: undeliverable, reported by the runtime
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.1)


def test_closing_the_receiver_fails_its_pending_recv():
    _, receiver = Channel.open()
    pending = receiver.recv()
    receiver.close()
    with pytest.raises(RuntimeError, match="closed"):
        pending.get(timeout=T)
    with pytest.raises(RuntimeError, match="closed"):
        receiver.recv().get(timeout=T)


async def _recv_all(receiver, n):
    return [await receiver.recv() for _ in range(n)]


def test_recv_can_be_awaited(spawn):
    import asyncio

    mesh = spawn(Sender)
    port, receiver = Channel.open()
    mesh.send_range.broadcast(port, 3)
    got = asyncio.run(asyncio.wait_for(_recv_all(receiver, 6), T))
    assert sorted(got) == [(r, i) for r in (0, 1) for i in range(3)]


def test_explicit_response_port_call_one_resolves_with_what_is_sent(spawn):
    one = spawn(Replier).slice(gpus=1)
    assert one.twice.call_one(21).get(timeout=T) == 42
    assert one.seen.call_one().get(timeout=T) == [21]  # the body ran past port.send
    with pytest.raises(TypeError):
        one.twice.call_one()  # the port is not the caller's argument: x is missing


def test_explicit_response_port_with_call_choose_and_stream(spawn):
    mesh = spawn(Replier)
    assert mesh.twice.call(5).get(timeout=T).values() == [10, 10]
    assert mesh.who.call().get(timeout=T).values() == [0, 1]
    assert mesh.who.choose().get(timeout=T) in (0, 1)
    assert sorted(f.get(timeout=T) for f in mesh.twice.stream(1)) == [2, 2]


def test_explicit_response_port_exception_and_raise(spawn, faults):
    """port.exception() fails the call only; an exception that escapes the method fails the
    actor (EP-7, as Monarch does): its caller gets SupervisionError, the other rank serves."""
    mesh = spawn(Replier)
    one = mesh.slice(gpus=0)
    with pytest.raises(PermissionError, match="not you"):
        one.refuse.call_one("not you").get(timeout=T)
    assert one.twice.call_one(1).get(timeout=T) == 2  # the actor lives on
    with pytest.raises(SupervisionError, match="raised instead of answering"):
        one.raises.call_one().get(timeout=T)
    with pytest.raises(SupervisionError, match="raised instead of answering"):
        one.twice.call_one(1).get(timeout=T)  # it failed
    assert mesh.slice(gpus=1).twice.call_one(1).get(timeout=T) == 2
    assert [(f.mesh_name, f.rank) for f in faults.wait(1)] == [(mesh.name, 0)]


def test_send_with_a_port_collects_every_actor_result(spawn):
    mesh = spawn(Sender)
    port, receiver = Channel.open()
    assert send(mesh.double, (4,), {}, port=port) is None
    assert [receiver.recv().get(timeout=T) for _ in range(2)] == [8, 8]
    send(mesh.double, (5,), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=T) == 10
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.2)  # choose: one actor only


def test_send_with_a_port_reports_exceptions_there(spawn):
    mesh = spawn(Sender)
    port, receiver = Channel.open()
    send(mesh.boom, (), {}, port=port, selection="choose")
    with pytest.raises(ActorError, match="boom"):
        receiver.recv().get(timeout=T)
    assert mesh.double.call(1).get(timeout=T).values() == [2, 2]  # nobody failed


def test_send_without_a_port_is_fire_and_forget(spawn):
    class Tally(Actor):
        def __init__(self):
            self.n = 0

        @endpoint
        def add(self, k):
            self.n += k

        @endpoint
        def total(self):
            return self.n

    mesh = spawn(Tally)
    send(mesh.add, (3,), {})
    send(mesh.add, (), {"k": 4}, selection="choose")
    assert sum(mesh.total.call().get(timeout=T).values()) == 10
    with pytest.raises(TypeError):
        send(mesh.add, (1, 2), {})  # checked against the signature, nothing sent
    with pytest.raises(ValueError):
        send(mesh.add, (1,), {}, selection="some")


def test_a_reply_port_of_a_broadcast_drops_what_is_sent(spawn):
    one = spawn(Replier).slice(gpus=0)
    one.twice.broadcast(7)  # nobody awaits: the port drops the answer, the body still runs
    deadline = time.monotonic() + T
    while one.seen.call_one().get(timeout=T) != [7] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert one.seen.call_one().get(timeout=T) == [7]


class Collector(Actor):
    """Opens a channel inside its own process and gathers what other actors send there."""

    @endpoint
    def gather(self, senders, n: int) -> list:
        port, receiver = Channel[tuple].open()
        senders.send_range.broadcast(port, n)
        return sorted(receiver.recv().get(timeout=5) for _ in range(n * len(senders)))


def test_a_channel_opened_inside_an_actor(spawn):
    senders = spawn(Sender)
    got = spawn(Collector).slice(gpus=0).gather.call_one(senders, 3).get(timeout=T)
    assert got == [(r, i) for r in (0, 1) for i in range(3)]
