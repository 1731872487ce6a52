"""get_meter(), span(), traced(): telemetry as Monarch's ``monarch.actor`` offers it.

Measurements are kept in this process: a Counter or UpDownCounter adds up, a Histogram keeps
count, sum, min and max, each per attribute set (``Meter.snapshot()`` reads them). A span
measures the wall time of a block or a function (``traced``) and logs it at DEBUG on the
``podium.telemetry`` logger with the current actor, and records it in the histogram
``span.<name>.seconds`` of get_meter(). When OpenTelemetry is installed, spans are also
started on its tracer (``opentelemetry.trace``), so an exporter the program configured sees
them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from podium._src.context import actor_context

_log = logging.getLogger("podium.telemetry")

try:  # optional: spans reach OpenTelemetry when the program has it
    from opentelemetry import trace as _otel_trace  # type: ignore
except Exception:  # not installed
    _otel_trace = None

_Key = Tuple[Tuple[str, str], ...]


def _key(attributes: Optional[Mapping[str, Any]]) -> _Key:
    return tuple(sorted((str(k), str(v)) for k, v in (attributes or {}).items()))


class _Instrument:
    def __init__(self, meter: "Meter", name: str, unit: str, description: str) -> None:
        self.name, self.unit, self.description = name, unit, description
        self._lock = meter._lock


class Counter(_Instrument):
    """Adds up non-negative amounts, per attribute set."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self._values: Dict[_Key, float] = {}

    def add(self, amount: float, attributes: Optional[Mapping[str, Any]] = None,
            context: Any = None) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name}: amount must be >= 0, not {amount}")
        with self._lock:
            k = _key(attributes)
            self._values[k] = self._values.get(k, 0) + amount

    def _snapshot(self) -> Dict[_Key, Any]:
        return dict(self._values)


class UpDownCounter(Counter):
    """Adds up amounts of either sign, per attribute set."""

    def add(self, amount: float, attributes: Optional[Mapping[str, Any]] = None,
            context: Any = None) -> None:
        with self._lock:
            k = _key(attributes)
            self._values[k] = self._values.get(k, 0) + amount


class Histogram(_Instrument):
    """Records values: count, sum, min and max per attribute set."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self._values: Dict[_Key, Dict[str, float]] = {}

    def record(self, amount: float, attributes: Optional[Mapping[str, Any]] = None,
               context: Any = None) -> None:
        with self._lock:
            k = _key(attributes)
            s = self._values.get(k)
            if s is None:
                self._values[k] = {"count": 1, "sum": amount, "min": amount, "max": amount}
            else:
                s["count"] += 1
                s["sum"] += amount
                s["min"] = min(s["min"], amount)
                s["max"] = max(s["max"], amount)

    def _snapshot(self) -> Dict[_Key, Any]:
        return {k: dict(v) for k, v in self._values.items()}


class Meter:
    """Creates instruments by name (the same name gives the same instrument)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._instruments: Dict[str, _Instrument] = {}

    def _get(self, cls: type, name: str, unit: str, description: str) -> Any:
        with self._lock:
            inst = self._instruments.get(name)
            if inst is None:
                inst = self._instruments[name] = cls(self, name, unit, description)
            elif type(inst) is not cls:
                raise ValueError(f"meter {self.name}: {name} is a {type(inst).__name__}, "
                                 f"not a {cls.__name__}")
            return inst

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return self._get(Counter, name, unit, description)

    def create_up_down_counter(self, name: str, unit: str = "",
                               description: str = "") -> UpDownCounter:
        return self._get(UpDownCounter, name, unit, description)

    def create_histogram(self, name: str, unit: str = "", description: str = "",
                         **_: Any) -> Histogram:
        return self._get(Histogram, name, unit, description)

    def snapshot(self) -> Dict[str, Dict[_Key, Any]]:
        """Every instrument's values by attribute set, e.g.
        ``{"requests": {(("route", "/a"),): 3}}``."""
        with self._lock:
            return {n: i._snapshot() for n, i in self._instruments.items()}  # type: ignore


_METER = Meter("podium")


def get_meter() -> Meter:
    """This process's meter (as Monarch's ``get_meter()``)."""
    return _METER


class Span:
    """A timed block: ``with span("load"):``. ``duration`` (seconds) once it ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.actor: Optional[str] = None
        self.duration: Optional[float] = None
        self._start = 0.0
        self._otel: Any = None

    def __enter__(self) -> "Span":
        ctx = actor_context()
        self.actor = str(ctx.actor_instance.actor_id) if ctx is not None else None
        if _otel_trace is not None:
            self._otel = _otel_trace.get_tracer("podium").start_as_current_span(self.name)
            self._otel.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.duration = time.perf_counter() - self._start
        if self._otel is not None:
            self._otel.__exit__(*exc)
        _METER.create_histogram(f"span.{self.name}.seconds").record(self.duration)
        _log.debug("span %s took %.6f s%s%s", self.name, self.duration,
                   f" in actor {self.actor}" if self.actor else "",
                   " (raised)" if exc[0] is not None else "")


def span(name: str) -> Span:
    """A span named ``name``, to use as a context manager."""
    return Span(name)


def traced(fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None) -> Any:
    """``@traced`` or ``@traced(name="...")``: each call of the (sync or async) function runs
    in a span named after it."""

    def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
        span_name = name if name is not None else f.__name__
        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with span(span_name):
                    return await f(*args, **kwargs)

            return async_wrapper

        @functools.wraps(f)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            with span(span_name):
                return f(*args, **kwargs)

        return sync_wrapper

    return decorator(fn) if fn is not None else decorator
