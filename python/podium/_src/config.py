"""podium.actor.config: runtime settings, as Monarch's ``monarch.actor.config`` (the module
attribute ``prefix_python_logs_with_actor``) and ``monarch.config`` (``configure(**kwargs)``,
``get_global_config()``, ``get_runtime_config()``, ``clear_runtime_config()``,
``configured(**overrides)``).

``configure`` takes Monarch's key names. A key that maps to a podium setting changes it for
real (``SETTINGS`` says which, and docs/python.md lists them); a Monarch key podium has no
counterpart for is recorded (``get_runtime_config()`` shows it) with a warning that it does
nothing here; any other key raises ValueError. Durations take Monarch's humantime strings
(``"30s"``, ``"1m 30s"``, ``"500ms"``), seconds as a number, or a ``datetime.timedelta``.

  CF-1 configure() applies every key or none: an unknown key or a bad value raises before any
    setting changes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional

from podium._src import actor_mesh, context, proc_mesh, runtime

# As Monarch's: whether Python logging records made inside an actor carry "[actor=...] "
# (context.py reads it for each record; LG-1).
prefix_python_logs_with_actor = True

_lock = threading.Lock()
_runtime: Dict[str, Any] = {}  # the runtime layer: what configure() set, by key
_warned: set = set()

_UNITS = {
    "ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-z]+)\s*")


def parse_duration(value: Any) -> float:
    """Seconds of a humantime string (``"1h 30m"``), a number of seconds, or a timedelta."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text, pos, seconds = value.strip().lower(), 0, 0.0
        if not text:
            raise ValueError("a duration cannot be empty")
        while pos < len(text):
            m = _PART.match(text, pos)
            if m is None or m.group(2) not in _UNITS:
                raise ValueError(f"not a duration: {value!r} (expected e.g. '30s', '1m 30s', "
                                 f"'500ms')")
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
    else:
        raise TypeError(f"a duration is a str such as '30s', a number of seconds or a "
                        f"timedelta, not {type(value).__name__}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


@dataclass(frozen=True)
class Setting:
    """A configure() key that podium has: how to check a value, apply it and read it."""
    check: Callable[[Any], Any]  # the value to apply; raises for a bad one
    apply: Callable[[Any], None]
    read: Callable[[], Any]
    doc: str


def _module_attr(module: Any, attr: str, scale: float, as_int: bool) -> Setting:
    def apply(seconds: float) -> None:
        v = seconds * scale
        setattr(module, attr, int(v) if as_int else v)

    def read() -> float:
        return getattr(module, attr) / scale

    return Setting(parse_duration, apply, read, f"{module.__name__}.{attr}")


def _both(*settings: Setting) -> Setting:
    def apply(v: Any) -> None:
        for s in settings:
            s.apply(v)

    return Setting(settings[0].check, apply, settings[0].read,
                   " and ".join(s.doc for s in settings))


def _env_ms(name: str) -> Setting:
    """A duration the runtime reads from the environment when it starts (in this process
    and in the procs it starts): settable only before podium starts here."""

    def check(value: Any) -> float:
        seconds = parse_duration(value)
        if runtime.running() and os.environ.get(name) != str(int(round(seconds * 1000))):
            raise RuntimeError(f"configure: {name} is read when podium starts; it already "
                               f"runs in this process, so set it before the first mesh")
        return seconds

    def apply(seconds: float) -> None:
        os.environ[name] = str(int(round(seconds * 1000)))

    def read() -> Optional[float]:
        v = os.environ.get(name, "")
        return int(v) / 1000 if v.isdigit() else None

    return Setting(check, apply, read, f"environment variable {name}")


def _transport() -> Setting:
    def check(v: Any) -> Any:
        name = getattr(v, "name", v)
        if not isinstance(name, str):
            raise TypeError(f"default_transport is a ChannelTransport or a str, not {v!r}")
        return v

    def apply(v: Any) -> None:
        runtime.enable_transport(v)

    def read() -> str:
        return runtime.listen_address() or "unix"

    return Setting(check, apply, read, "enable_transport()")


def _prefix() -> Setting:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise TypeError(f"prefix_python_logs_with_actor is a bool, not {v!r}")
        return v

    def apply(v: bool) -> None:
        global prefix_python_logs_with_actor
        prefix_python_logs_with_actor = v

    return Setting(check, apply, lambda: prefix_python_logs_with_actor,
                   "podium.actor.config.prefix_python_logs_with_actor")


# podium's own key: the timeout of collectives along mesh dimensions (podium.tensor), read by
# the controller when it spawns the collectives' store (docs/collectives.md, CO-5).
collective_timeout_s = 60.0


def _collective_timeout() -> Setting:
    def check(value: Any) -> float:
        seconds = parse_duration(value)
        if seconds <= 0:
            raise ValueError(f"collective_timeout must be positive, not {value!r}")
        return seconds

    def apply(seconds: float) -> None:
        global collective_timeout_s
        collective_timeout_s = seconds

    return Setting(check, apply, lambda: collective_timeout_s,
                   "podium.actor.config.collective_timeout_s")


def _settings() -> Dict[str, Setting]:
    actor_stop = _module_attr(actor_mesh, "STOP_GRACE_S", 1.0, False)
    procs_actor_stop = _module_attr(proc_mesh, "STOP_ACTORS_MS", 1000.0, True)
    proc_exit = _module_attr(proc_mesh, "STOP_GRACE_MS", 1000.0, True)
    attach = _env_ms("PODIUM_ATTACH_TIMEOUT_MS")
    return {
        "default_transport": _transport(),
        # ActorMesh.stop() and ProcMesh.stop(): how long actors may take to stop.
        "stop_actor_timeout": _both(actor_stop, procs_actor_stop),
        # ProcMesh.stop(): how long procs may take to exit before they are killed.
        "process_exit_timeout": proc_exit,
        "mesh_terminate_timeout": proc_exit,
        "proc_stop_max_idle": proc_exit,
        # Attaching workers: how long to wait for each to answer.
        "host_spawn_ready_timeout": attach,
        "mesh_attach_config_timeout": attach,
        # How long a host may stay silent before it counts as lost.
        "supervision_watchdog_timeout": _env_ms("PODIUM_HOST_LOST_MS"),
        "prefix_python_logs_with_actor": _prefix(),
        # podium's own: how long a collective may wait for its group (podium.tensor).
        "collective_timeout": _collective_timeout(),
    }


SETTINGS: Dict[str, Setting] = _settings()

# Monarch's keys that podium has no counterpart for: recorded, with a warning.
MONARCH_ONLY = frozenset({
    "enable_log_forwarding", "enable_file_capture", "tail_log_lines", "codec_max_frame_length",
    "message_delivery_timeout", "mesh_proc_spawn_max_idle", "message_ack_time_interval",
    "message_ack_every_n_messages", "message_ttl_default", "split_max_buffer_size",
    "split_max_buffer_age", "cleanup_timeout", "default_encoding",
    "channel_net_rx_buffer_full_check_interval", "channel_tcp_congestion",
    "message_latency_sampling_rate", "enable_dest_actor_reordering_buffer",
    "mesh_bootstrap_enable_pdeathsig", "mesh_terminate_concurrency", "small_write_threshold",
    "max_cast_dimension_size", "remote_alloc_bind_to_inaddr_any",
    "remote_alloc_bootstrap_addr", "remote_alloc_allowed_port_range", "read_log_buffer",
    "force_file_log", "prefix_with_rank", "actor_spawn_max_idle", "get_actor_state_max_idle",
    "get_proc_state_max_idle", "mesh_admin_addr", "mesh_orphan_timeout", "pyspy_bin",
    "rdma_allow_tcp_fallback", "rdma_disable_ibverbs", "rdma_max_chunk_size_mb",
    "rdma_ibverbs_target", "rdma_peer_device_affinity", "rdma_max_nics_per_buffer",
    "rdma_min_stripe_size_kb", "rdma_qps_per_cq", "rdma_cq_poller_per_device",
    "rdma_runtime_worker_threads",
})

# The values before any configure(): what clear_runtime_config() goes back to.
_defaults: Dict[str, Any] = {k: s.read() for k, s in SETTINGS.items()}


def configure(**kwargs: Any) -> None:
    """Sets runtime settings of this process by Monarch's key names (CF-1: all or none).
    ValueError for a key Monarch does not have either; a Monarch key that podium has no
    counterpart for is recorded and warns that it has no effect."""
    checked: Dict[str, Any] = {}
    for key, value in kwargs.items():
        setting = SETTINGS.get(key)
        if setting is not None:
            checked[key] = setting.check(value)
        elif key not in MONARCH_ONLY:
            raise ValueError(f"configure: unknown setting {key!r}; podium's are "
                             f"{sorted(SETTINGS)}")
    with _lock:
        for key, value in kwargs.items():
            if key in checked:
                SETTINGS[key].apply(checked[key])
            elif key not in _warned:
                _warned.add(key)
                warnings.warn(f"configure({key}=...): podium has no such setting; the value "
                              f"is recorded but changes nothing", RuntimeWarning, stacklevel=2)
            _runtime[key] = value


def get_runtime_config() -> Dict[str, Any]:
    """What configure() set in this process, by key (a copy)."""
    with _lock:
        return dict(_runtime)


def get_global_config() -> Dict[str, Any]:
    """Every setting podium has with its value now (defaults, the environment, configure()),
    plus the Monarch-only keys configure() recorded."""
    with _lock:
        out = {k: s.read() for k, s in SETTINGS.items()}
        out.update({k: v for k, v in _runtime.items() if k not in SETTINGS})
        return out


def clear_runtime_config() -> None:
    """Forgets what configure() set: podium's settings go back to their values before it
    (those read when podium started stay as the runtime read them)."""
    with _lock:
        keys = list(_runtime)
        _runtime.clear()
        for key in keys:
            setting = SETTINGS.get(key)
            default = _defaults.get(key)
            if setting is None or default is None:
                continue
            try:
                setting.apply(setting.check(default))
            except RuntimeError:  # read when podium started: it keeps what it read
                pass


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[Dict[str, Any]]:
    """Applies ``overrides`` for the ``with`` block, yielding get_global_config(); restores
    the settings configure() had set before on exit."""
    saved = get_runtime_config()
    configure(**overrides)
    try:
        yield get_global_config()
    finally:
        clear_runtime_config()
        if saved:
            configure(**saved)


# context.py reads prefix_python_logs_with_actor from this module (LG-1).
context.set_config_module(sys.modules[__name__])
