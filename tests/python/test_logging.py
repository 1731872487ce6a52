"""Logging like Monarch (issue 18, part 8): the [actor=...] prefix of logging records made in
actors (LG-1), ProcMesh.logging_option (LG-3), Actor.logger, actor_instance.creator, and
actor_instance.abort(reason) (LG-2)."""

from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import CHILD_TIMEOUT_S
from podium.actor import Actor, context, endpoint, SupervisionError, this_proc

T = 30


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(self.format(record))


class Logs(Actor):
    @endpoint
    def log(self, text, prefix=True):
        from podium.actor import config

        config.prefix_python_logs_with_actor = prefix
        h1, h2 = ListHandler(), ListHandler()
        lg = logging.getLogger("test_logging.two_handlers")
        lg.addHandler(h1)
        lg.addHandler(h2)
        try:
            lg.warning(text)
            lg.warning("")  # empty messages stay empty (structured logging uses them)
            self.logger.debug("via Actor.logger")
        finally:
            lg.removeHandler(h1)
            lg.removeHandler(h2)
            config.prefix_python_logs_with_actor = True
        return h1.messages, h2.messages, self.logger.name, self.logger.level

    @endpoint
    def who(self):
        inst = context().actor_instance
        return repr(inst), repr(inst.creator), inst.creator.name

    @endpoint
    def spawn_child(self):
        child = this_proc().spawn("child_of_logs", Logs)
        return child.who.call_one().get(timeout=T)

    @endpoint
    def abort(self, reason):
        context().actor_instance.abort(reason)
        return "not reached"

    @endpoint
    def ok(self):
        return "ok"


class AsyncAborts(Actor):
    @endpoint
    async def abort(self, reason):
        context().actor_instance.abort(reason)

    @endpoint
    async def ok(self):
        return "ok"


def test_logging_records_in_an_actor_carry_its_name(spawn):  # LG-1
    one = spawn(Logs).slice(gpus=1)
    first, second, name, level = one.log.call_one("hello").get(timeout=T)
    mesh = one.name
    prefix = f"[actor=<client>.<test_logging.Logs {mesh}{{'gpus': 1/2}}>] "
    assert first[0] == prefix + "hello", first
    assert second[0] == first[0]  # once per record, whatever the handlers
    assert first[1] == ""
    assert (name, level) == ("Logs", logging.DEBUG)  # Actor.logger, as Monarch's
    # Outside actors, and with the setting off, records are left as they are.
    off, _, _, _ = one.log.call_one("plain", False).get(timeout=T)
    assert off[0] == "plain"
    h = ListHandler()
    lg = logging.getLogger("test_logging.outside")
    lg.addHandler(h)
    lg.warning("outside")
    lg.removeHandler(h)
    assert h.messages == ["outside"]


def test_the_creator_of_an_actor_is_who_spawned_it(spawn):
    one = spawn(Logs).slice(gpus=0)
    me, creator, creator_name = one.who.call_one().get(timeout=T)
    assert creator == "<client>" and creator_name == "client"
    assert me == f"<client>.<test_logging.Logs {one.name}{{'gpus': 0/2}}>"
    assert context().actor_instance.creator is None  # the client has none
    child, child_creator, name = one.spawn_child.call_one().get(timeout=T)
    assert name == one.name
    assert child_creator == me and child.startswith(me + ".<test_logging.Logs child_of_logs")


@pytest.mark.parametrize("cls", [Logs, AsyncAborts])
def test_abort_fails_the_actor_with_its_reason(spawn, faults, cls):  # LG-2
    mesh = spawn(cls)
    one = mesh.slice(gpus=1)
    with pytest.raises(SupervisionError, match="the actor aborted: enough of this") as info:
        one.abort.call_one("enough of this").get(timeout=T)
    assert str(info.value).startswith(f"Endpoint call {mesh.name}.abort() failed, The actor ")
    with pytest.raises(SupervisionError, match="the actor aborted: enough of this"):
        one.ok.call_one().get(timeout=T)
    assert mesh.slice(gpus=0).ok.call_one().get(timeout=T) == "ok"  # the other rank lives
    failures = faults.wait(1)
    assert failures and "the actor aborted: enough of this" in failures[-1].report()
    assert failures[-1].rank == 1


def test_abort_from_elsewhere_is_refused():
    with pytest.raises(RuntimeError, match="only the actor"):
        context().actor_instance.abort("no")


def _run(tmp_path, body):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL, cwd=tmp_path,
                          env={**os.environ, "PODIUM_LOG_DIR": str(tmp_path / "logs")})


def test_logging_option_sets_the_level_and_where_output_goes(tmp_path):  # LG-3
    r = _run(tmp_path, """
        import asyncio, logging, sys
        from podium.actor import Actor, endpoint, this_host

        class Talker(Actor):
            @endpoint
            def talk(self, word):
                logging.getLogger("talker").info("info %s", word)
                logging.getLogger("talker").warning("warning %s", word)
                print("print", word, flush=True)

        async def main():
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            talker = procs.spawn("talker", Talker)
            await procs.logging_option(stream_to_client=True, level=logging.INFO)
            await talker.talk.call("one")
            await procs.logging_option(stream_to_client=True, level=logging.WARNING)
            await talker.talk.call("two")
            await procs.logging_option(stream_to_client=False, level=logging.INFO)
            await talker.talk.call("three")
            procs.logging_option(stream_to_client=True, aggregate_window_sec=3).get(timeout=30)
            await talker.talk.call("four")
            try:
                procs.logging_option(stream_to_client=False, aggregate_window_sec=3)
            except ValueError as e:
                print("REFUSED", e, flush=True)
            try:
                procs.logging_option(level=1000)
            except ValueError as e:
                print("REFUSED", e, flush=True)
            await procs.stop()

        asyncio.run(main())
        """)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "[actor=<client>.<__main__.Talker talker{'gpus': 0/2}>] info one" in out, out
    assert "info two" not in out and "warning two" in out  # level WARNING
    assert "three" not in out  # in the procs' files instead
    assert "info four" in out and "print four" in out  # back to the client
    assert out.count("REFUSED") == 2
    files = glob.glob(str(tmp_path / "logs" / "proc-*.log"))
    assert len(files) == 2, files
    text = "".join(open(f).read() for f in files)
    assert "info three" in text and "print three" in text
    # PL-1: the procs' log files keep every line, also those streamed to the client.
    assert "info four" in text and "print four" in text
