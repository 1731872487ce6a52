"""BootstrapCommand and default_bootstrap_cmd(): the command that starts a proc, as Monarch's
``monarch.actor`` names them.

``HostMesh.spawn_procs(bootstrap_command=...)`` takes one BootstrapCommand for every proc, or
a function of each proc's Point (its coordinates over the host and ``per_host`` dimensions)
that returns one. The proc is then started by exec'ing ``program`` with ``args`` (never
forked from the zygote), its environment the spawning host's with ``env`` on top (a ``None``
value removes a variable; ``inherit_env=False`` starts from an empty one). podium's launch
variables (PODIUM_BOOT, and PODIUM_PROC_BIND for ``proc_bind``) are always set: a command
that wraps the default must end by exec'ing it with its environment, e.g. a script that
records something and then runs ``exec "$@"``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from podium._src.runtime import PROC_ARGV
from podium._src.shape import Extent, Point


class BootstrapCommand:
    """A proc's command: ``program`` exec'd with ``args`` (``arg0``: its argv[0], the
    program by default), ``env`` applied to the inherited environment."""

    def __init__(self, program: str, arg0: Optional[str] = None,
                 args: Optional[List[str]] = None,
                 env: Optional[Mapping[str, Optional[str]]] = None,
                 inherit_env: bool = True) -> None:
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand: program must be a non-empty str, not {program!r}")
        if arg0 is not None and not isinstance(arg0, str):
            raise TypeError(f"BootstrapCommand: arg0 must be a str or None, not {arg0!r}")
        self.program = program
        self.arg0 = arg0
        self.args = [self._str("an argument", a) for a in (args or [])]
        self.env = env or {}
        self.inherit_env = bool(inherit_env)

    @staticmethod
    def _str(what: str, v: object) -> str:
        if not isinstance(v, str):
            raise TypeError(f"BootstrapCommand: {what} must be a str, not {v!r}")
        return v

    @property
    def env(self) -> Dict[str, Optional[str]]:
        return dict(self._env)

    @env.setter
    def env(self, env: Mapping[str, Optional[str]]) -> None:
        checked: Dict[str, Optional[str]] = {}
        for k, v in dict(env).items():
            if not isinstance(k, str) or not k or "=" in k:
                raise ValueError(f"BootstrapCommand: bad environment variable name {k!r}")
            if v is not None and not isinstance(v, str):
                raise TypeError(f"BootstrapCommand: env[{k!r}] must be a str or None, not {v!r}")
            checked[k] = v
        self._env = checked

    def with_env(self, env: Mapping[str, Optional[str]]) -> "BootstrapCommand":
        """A copy with ``env`` merged on top of this command's environment."""
        merged = self.env
        merged.update(env)
        return BootstrapCommand(self.program, self.arg0, list(self.args), merged,
                                self.inherit_env)

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

    def _launch(self) -> tuple:
        """The (program, argv, env, unset) the C++ spawner takes (mesh/launch.h)."""
        argv = [self.arg0 or self.program, *self.args]
        env = [(k, v) for k, v in self._env.items() if v is not None]
        unset = [k for k, v in self._env.items() if v is None]
        return self.program, argv, env, unset, self.inherit_env

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BootstrapCommand) and self.program == other.program
                and self.arg0 == other.arg0 and self.args == other.args
                and self._env == other._env and self.inherit_env == other.inherit_env)

    def __repr__(self) -> str:
        return (f"BootstrapCommand(program={self.program!r}, arg0={self.arg0!r}, "
                f"args={self.args!r}, env={self._env!r}, inherit_env={self.inherit_env!r})")


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command podium starts procs with: this interpreter running ``-m podium._src.proc``
    (procs inherit the spawning host's environment; the command adds nothing to it). A base
    to customize with ``with_env()`` or by changing its attributes."""
    return BootstrapCommand(PROC_ARGV[0], None, list(PROC_ARGV[1:]), {})


def _python_command(python_executable: str) -> BootstrapCommand:
    """The default command with another interpreter (HostMesh.with_python_executable)."""
    return BootstrapCommand(python_executable, None, list(PROC_ARGV[1:]), {})


def _prod(values: Any) -> int:
    n = 1
    for v in values:
        n *= v
    return n


_BIND_KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")


def _launches(labels: List[str], sizes: List[int], per_host: int,
              proc_bind: Optional[List[Dict[str, str]]], command: Any) -> List[tuple]:
    """One (program, argv, env, unset, inherit_env, bind) per rank of the spawned extent, or
    [] when every proc starts as podium's default (mesh/launch.h)."""
    if proc_bind is not None:
        if isinstance(proc_bind, dict) or not isinstance(proc_bind, (list, tuple)):
            raise TypeError(f"proc_bind is a list of dicts, one per proc of a host, not "
                            f"{proc_bind!r}")
        if len(proc_bind) != per_host:
            raise ValueError(f"proc_bind length ({len(proc_bind)}) must equal "
                             f"procs_per_host ({per_host})")
        for entry in proc_bind:
            if not isinstance(entry, dict):
                raise TypeError(f"proc_bind entries are dicts such as {{'cpus': '0-3'}}, "
                                f"not {entry!r}")
            for k, v in entry.items():
                if k not in _BIND_KEYS:
                    raise ValueError(f"proc_bind key {k!r} is not one of {', '.join(_BIND_KEYS)}")
                if not isinstance(v, str):
                    raise TypeError(f"proc_bind[{k!r}] is a str such as '0-3', not {v!r}")
    if isinstance(command, (list, tuple)):
        if len(command) != _prod(sizes):
            raise ValueError(f"bootstrap_command: {len(command)} commands for "
                             f"{_prod(sizes)} procs; give one, or one per rank")
        per_rank = list(command)
        command = lambda point: per_rank[point.rank]  # noqa: E731
    if command is not None and not isinstance(command, BootstrapCommand) \
            and not callable(command):
        raise TypeError("bootstrap_command is a BootstrapCommand, a list of one per rank, or "
                        f"a function of a Point returning one, not {command!r}")
    if proc_bind is None and command is None:
        return []
    extent = Extent(labels, sizes)
    out = []
    for rank in range(_prod(sizes)):
        cmd = command
        if command is not None and not isinstance(command, BootstrapCommand):
            cmd = command(Point(rank, extent))
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command returned {cmd!r} for rank {rank}, not a "
                                "BootstrapCommand")
        program, argv, env, unset, inherit = cmd._launch() if cmd is not None else (
            "", [], [], [], True)
        bind = list(proc_bind[rank % per_host].items()) if proc_bind is not None else []
        out.append((program, argv, env, unset, inherit, bind))
    return out


__all__ = ["BootstrapCommand", "default_bootstrap_cmd"]
