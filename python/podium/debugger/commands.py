"""The commands of the debugger's prompt (``podium_dbg>``) and their parsing.

    help | h                      the commands
    list | l                      the stopped actors: actor, rank, coordinates, host, function, line
    attach | a ACTOR RANK         a pdb session on one actor ("detach" returns to the prompt)
    cast ACTOR ranks(SPEC) CMD    one pdb command to many ranks of ACTOR
    continue | c                  clear every breakpoint and resume every stopped actor
    quit | q                      leave the prompt; the actors stay stopped

A rank SPEC, as Monarch's: one rank ``ranks(1)``, a list ``ranks(1,3)``, a range
``ranks(start?:stop?(:step)?)`` (``ranks(1:3)`` is ranks 1 and 2), or mesh coordinates
``ranks(hosts=1, gpus=0:2)`` whose values are a coordinate, a range or a list ``(0,2)``.

  DB-1 A line that is not a command, or a command with bad arguments, raises CommandError
    whose text says what is wrong; the prompt prints it and reads the next line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

Coordinate = Union[int, range, List[int]]
Ranks = Union[int, List[int], range, Dict[str, Coordinate]]

HELP = """podium_dbg commands:
  list | l                      list the stopped actors: actor, rank, coordinates, host,
                                function, line
  attach | a ACTOR RANK         open the pdb session of one actor; 'detach' returns here
  cast ACTOR ranks(SPEC) CMD    send one pdb command to several ranks of ACTOR; SPEC is a rank
                                ranks(1), a list ranks(1,3), a range ranks(start:stop:step) or
                                coordinates ranks(hosts=0, gpus=1:3) (values: n, a:b:c, (a,b))
  continue | c                  clear every breakpoint and resume every stopped actor
  quit | q                      leave the debugger; stopped actors stay stopped
  help | h                      this text
"""


class CommandError(ValueError):
    """A line the prompt cannot run (DB-1)."""


@dataclass
class Help:
    pass


@dataclass
class ListSessions:
    pass


@dataclass
class Attach:
    actor_name: str
    rank: int


@dataclass
class Cast:
    actor_name: str
    ranks: Ranks
    command: str


@dataclass
class Continue:
    pass


@dataclass
class Quit:
    pass


Command = Union[Help, ListSessions, Attach, Cast, Continue, Quit]

_NAME = re.compile(r"[-_.a-zA-Z0-9]+\Z")
_INT = re.compile(r"\s*(-?[0-9]+)\s*\Z")


def _int(text: str, what: str) -> int:
    m = _INT.match(text)
    if m is None:
        raise CommandError(f"{what}: '{text.strip()}' is not an integer")
    return int(m.group(1))


def _range(text: str) -> range:
    parts = text.split(":")
    if len(parts) > 3:
        raise CommandError(f"rank range '{text.strip()}' has more than start:stop:step")
    start = _int(parts[0], "range start") if parts[0].strip() else 0
    stop = _int(parts[1], "range stop") if parts[1].strip() else sys.maxsize
    step = _int(parts[2], "range step") if len(parts) == 3 and parts[2].strip() else 1
    if step == 0:
        raise CommandError(f"rank range '{text.strip()}': the step cannot be 0")
    return range(start, stop, step)


def _coordinate(text: str) -> Coordinate:
    t = text.strip()
    if t.startswith("(") and t.endswith(")"):
        items = [s for s in t[1:-1].split(",")]
        if not items or not all(s.strip() for s in items):
            raise CommandError(f"coordinate list '{t}' is empty or has an empty item")
        return [_int(s, "coordinate") for s in items]
    if ":" in t:
        return _range(t)
    return _int(t, "coordinate")


def _split_top(text: str) -> List[str]:
    """Splits at the commas that are not inside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def parse_ranks(spec: str) -> Ranks:
    """The Ranks of the text inside ``ranks(...)`` (DB-1)."""
    s = spec.strip()
    if not s:
        raise CommandError("ranks() is empty: give a rank, a list, a range or coordinates")
    if "=" in s:
        dims: Dict[str, Coordinate] = {}
        for item in _split_top(s):
            if "=" not in item:
                raise CommandError(f"'{item.strip()}' is not DIM=VALUE (coordinates cannot be "
                                   f"mixed with plain ranks)")
            name, value = item.split("=", 1)
            name = name.strip()
            if not re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", name):
                raise CommandError(f"'{name}' is not a dimension name")
            if name in dims:
                raise CommandError(f"dimension '{name}' is given twice")
            dims[name] = _coordinate(value)
        return dims
    if ":" in s:
        return _range(s)
    if "," in s:
        items = s.split(",")
        if not all(i.strip() for i in items):
            raise CommandError(f"rank list '{s}' has an empty item")
        return [_int(i, "rank") for i in items]
    return _int(s, "rank")


def parse(line: str) -> Optional[Command]:
    """The command of ``line``; None for a blank line; CommandError otherwise (DB-1)."""
    text = line.strip()
    if not text:
        return None
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in ("h", "help"):
        return Help()
    if word in ("l", "list"):
        _no_args(word, rest)
        return ListSessions()
    if word in ("c", "continue"):
        _no_args(word, rest)
        return Continue()
    if word in ("q", "quit"):
        _no_args(word, rest)
        return Quit()
    if word in ("a", "attach"):
        args = rest.split()
        if len(args) != 2:
            raise CommandError("usage: attach ACTOR RANK")
        if not _NAME.match(args[0]):
            raise CommandError(f"'{args[0]}' is not an actor name")
        return Attach(args[0], _int(args[1], "attach: the rank"))
    if word == "cast":
        name, _, tail = rest.partition(" ")
        tail = tail.strip()
        if not name or not _NAME.match(name):
            raise CommandError("usage: cast ACTOR ranks(SPEC) COMMAND")
        if not tail.startswith("ranks("):
            raise CommandError("cast: the ranks come as ranks(SPEC), e.g. ranks(1:3); "
                               "usage: cast ACTOR ranks(SPEC) COMMAND")
        depth, end = 0, -1
        for i in range(len("ranks"), len(tail)):
            if tail[i] == "(":
                depth += 1
            elif tail[i] == ")":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        if end < 0:
            raise CommandError("cast: ranks( has no closing parenthesis")
        ranks = parse_ranks(tail[len("ranks("):end])
        command = tail[end + 1:].strip()
        if not command:
            raise CommandError("cast: no pdb command after ranks(...)")
        return Cast(name, ranks, command)
    raise CommandError(f"unknown command '{word}' (enter 'help' for the commands)")


def _no_args(word: str, rest: str) -> None:
    if rest:
        raise CommandError(f"'{word}' takes no arguments (got '{rest}')")


def selects(ranks: Optional[Ranks], rank: int, coords: Dict[str, int]) -> bool:
    """Whether a session of ``rank`` at ``coords`` is among ``ranks`` (None: all)."""
    if ranks is None:
        return True
    if isinstance(ranks, int):
        return rank == ranks
    if isinstance(ranks, (list, range)):
        return rank in ranks
    for dim, want in ranks.items():
        if dim not in coords:
            return False
        have = coords[dim]
        if isinstance(want, int):
            if have != want:
                return False
        elif have not in want:
            return False
    return True
