"""What an actor prints or logs reaches the controller's terminal, each line prefixed with
the actor's name and rank (issue 3, "Output")."""

from __future__ import annotations

import textwrap

from conftest import run_script

SCRIPT = textwrap.dedent(
    """
    import logging, sys, threading
    from podium.actor import Actor, endpoint, this_host

    class Talker(Actor):
        def __init__(self):
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

        @endpoint
        def talk(self, word):
            print(f"say {word}")
            print("two\\nlines")
            print("partial ", end="")
            print("line")
            print(f"err {word}", file=sys.stderr)
            logging.getLogger("talker").warning("logged %s", word)
            return word

    class Async(Actor):
        @endpoint
        async def talk(self, word):
            print(f"async {word}")
            return word

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    talkers = procs.spawn("talker", Talker)
    print("results", talkers.talk.call("hi").get(timeout=20).values())
    print("async", procs.spawn("asyncer", Async).slice(gpus=1).talk.call_one("yo").get(timeout=20))
    procs.stop().get(timeout=20)
    """
)


def test_actor_output_is_prefixed_with_name_and_rank(tmp_path):
    r = run_script(tmp_path, "talk.py", SCRIPT)
    assert r.returncode == 0, r.stderr
    out, err = r.stdout.splitlines(), r.stderr.splitlines()
    assert "results ['hi', 'hi']" in out and "async yo" in out, r.stdout
    for g in (0, 1):
        p = f"[talker {{'gpus': {g}/2}}] "
        assert f"{p}say hi" in out
        assert f"{p}two" in out and f"{p}lines" in out
        assert f"{p}partial line" in out
        assert f"{p}err hi" in err  # stderr stays stderr
        # Logging records also carry Monarch's [actor=...] prefix (LG-1).
        actor = f"[actor=<client>.<__main__.Talker talker{{'gpus': {g}/2}}>] "
        assert f"{p}WARNING {actor}logged hi" in err
    assert "[asyncer {'gpus': 1/2}] async yo" in out
    # Nothing an actor wrote went out without its prefix.
    assert not [line for line in out if "say hi" in line and not line.startswith("[talker")]
