"""BootstrapCommand and default_bootstrap_cmd(): how a proc process is started, as Monarch's
``monarch.actor.default_bootstrap_cmd()`` describes it.

A BootstrapCommand is a program, its arguments and environment changes. The default one is
podium's own proc launcher (``<this python> -m podium._src.proc``). Programs customize it
(``default_bootstrap_cmd().with_env({"NCCL_DEBUG": "INFO"})``, another ``program`` such as a
wrapper script) and pass it to ``spawn_procs(bootstrap_command=...)``, one for every proc or
a list with one per rank; ``argv`` and ``child_env(base)`` are what the launcher runs.
"""

from __future__ import annotations

import copy
import sys
from typing import Dict, List, Mapping, Optional

# podium's proc launcher (runtime.PROC_ARGV): the command every proc runs by default.
PROC_MODULE = "podium._src.proc"


class BootstrapCommand:
    """``program`` run as ``[arg0 or program, *args]``; ``env`` maps variables to values, a
    None value removing the variable; ``inherit_env`` (default True) starts from the
    environment of the host that spawns the proc, else from an empty one."""

    def __init__(self, program: str, arg0: Optional[str] = None,
                 args: Optional[List[str]] = None,
                 env: Optional[Mapping[str, Optional[str]]] = None,
                 inherit_env: bool = True) -> None:
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand: program must be a non-empty str, not {program!r}")
        self.program = program
        self.arg0 = arg0
        self.args = [str(a) for a in (args or [])]
        self._env: Dict[str, Optional[str]] = {}
        self.env = env or {}
        self.inherit_env = bool(inherit_env)

    @property
    def env(self) -> Dict[str, Optional[str]]:
        return dict(self._env)

    @env.setter
    def env(self, env: Mapping[str, Optional[str]]) -> None:
        for k, v in env.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, str)):
                raise TypeError(f"BootstrapCommand env maps str to str or None, got {k!r}: {v!r}")
        self._env = dict(env)

    def with_env(self, env: Mapping[str, Optional[str]]) -> "BootstrapCommand":
        """A copy with ``env`` merged on top (a None value removes the variable)."""
        out = copy.copy(self)
        merged = dict(self._env)
        merged.update(env)
        out.env = merged
        return out

    @property
    def argv(self) -> List[str]:
        """The argument vector the proc runs (``argv[0]`` is ``arg0`` when given)."""
        return [self.arg0 or self.program, *self.args]

    def child_env(self, base: Mapping[str, str]) -> Dict[str, str]:
        """The proc's environment, given the spawning host's ``base``."""
        out = dict(base) if self.inherit_env else {}
        for k, v in self._env.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BootstrapCommand) and (
            self.program, self.arg0, self.args, self._env, self.inherit_env) == (
            other.program, other.arg0, other.args, other._env, other.inherit_env)

    def __repr__(self) -> str:
        return (f"BootstrapCommand(program={self.program!r}, arg0={self.arg0!r}, "
                f"args={self.args!r}, env={self._env!r}, inherit_env={self.inherit_env})")


def default_bootstrap_cmd() -> BootstrapCommand:
    """podium's proc launcher with this Python: ``<sys.executable> -m podium._src.proc``,
    inheriting the spawning host's environment."""
    return BootstrapCommand(sys.executable, None, ["-m", PROC_MODULE], {})
