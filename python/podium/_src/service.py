"""Services (public as podium.service), as TorchForge's: ``MyActor.options(procs=P,
num_replicas=R).as_service(*args, **kwargs)`` starts R replicas of ``MyActor``, each an actor
mesh on P procs of its own, and returns a Service whose endpoints have the adverbs
``route`` (one replica, the least loaded), ``fanout`` (every healthy replica) and
``call_one`` (a chosen replica), with sticky sessions. Each replica is kept alive by a
restart.py Keeper: a failed replica is out of routing at once and replaced in the background.

Which replica a call goes to is decided in the process that started the service, from the
calls in flight through this Service object; the calls themselves go straight from the
caller to the replica's actors (no proxy actor).

Invariants:
  SR-1 route() sends a call to one healthy replica: to its session's replica while that one
       is healthy (sticky), else to the one with the fewest calls in flight through this
       service, ties broken round-robin; a session whose replica is not healthy moves to
       the replica chosen so.
  SR-2 fanout() calls every healthy replica once and returns their results in replica order.
  SR-3 A replica whose actor fails or whose proc ends leaves routing at once: on its
       supervision event (SV-8, not by polling), or on the first call through the service
       that fails with its SupervisionError, whichever comes first (a sync owner busy in an
       endpoint supervises only after it). It is replaced in the background, from then on (new procs, a new actor, restored from its last checkpoint when its class
       has ``__checkpoint__``/``__restore__``; RS-2), counted in its restarts, and routed to
       again once its new actor is up. Replicas are never told to the owner's
       ``__supervise__``; a replica out of restarts stays out of routing ("failed").
  SR-4 A route() call that fails because its replica failed (a SupervisionError, not the
       endpoint's own exception) is sent once more, to another healthy replica, unless
       retries are off: ``options(retry=False)``, ``@no_retry`` on the endpoint, or
       ``route(..., retry=False)`` (which wins). fanout() and call_one() are never resent.
  SR-5 Every wait is bounded: a call finding no healthy replica waits for one at most
       ``wait_timeout`` s, then raises ServiceError naming the service and every replica's
       state. A call's ServiceError names the service, the replica, the rank, the host, the
       pid and the cause.
  SR-6 shutdown() stops every replica (a restart in progress included): their actors stop,
       their procs exit, and it resolves once they are gone; later calls raise ServiceError.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from podium._src import endpoint as _endpoint
from podium._src.actor_mesh import check_endpoint_names
from podium._src.endpoint import EndpointProperty, check_spawn, endpoints_of
from podium._src.errors import ActorError, SupervisionError
from podium._src.future import Future
from podium._src.proc_mesh import HostMesh, this_host
from podium._src.restart import Keeper, RestartPolicy, Started

logger = logging.getLogger("podium.service")

# The options as_service takes (TorchForge's names where it has them).
_OPTIONS = ("procs", "num_replicas", "hosts", "name", "retry", "restart", "wait_timeout")
DEFAULT_RESTART = RestartPolicy(max_restarts=10, backoff=0.1, max_backoff=5.0)
_names = itertools.count()

# The session of `async with service.session():` (or `with`), for route() calls in it.
_session: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar(
    "podium_service_session", default=None)


class ServiceError(SupervisionError):
    """A service call failed because a replica failed or none was healthy (SR-4, SR-5).
    ``service``: its name; ``replica``: the replica's index (None: no replica was
    reachable); ``rank``, ``host``, ``pid``, ``cause``: of the failed actor, when known."""

    def __init__(self, message: str, service: str, replica: Optional[int] = None,
                 error: Optional[BaseException] = None) -> None:
        where: Dict[str, Any] = {}
        if isinstance(error, SupervisionError):
            where = {k: getattr(error, k) for k in ("cause", "mesh_name", "actor_class",
                                                    "actor_id", "rank", "point", "host",
                                                    "pid")}
        super().__init__(message, **where)
        self.service = service
        self.replica = replica


def no_retry(ep: Any) -> Any:
    """Marks an endpoint as not idempotent: route() never sends it twice (SR-4). Goes above
    or below ``@endpoint``."""
    target = ep._method if isinstance(ep, EndpointProperty) else ep
    target._podium_no_retry = True
    return ep


def _retries(cls: type, name: str) -> bool:
    prop = endpoints_of(cls).get(name)
    return prop is None or not getattr(prop._method, "_podium_no_retry", False)


class ServiceOptions:
    """What ``Actor.options(...)`` returns: ``as_service(*args, **kwargs)`` starts it.
    Options: ``procs`` (per replica, 1), ``num_replicas`` (1), ``hosts`` (a HostMesh to
    spawn on: this_host() by default), ``name``, ``retry`` (True, SR-4), ``restart`` (a
    RestartPolicy for the replicas), ``wait_timeout`` (30 s, SR-5)."""

    def __init__(self, cls: type, opts: Dict[str, Any]) -> None:
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"{cls.__qualname__}.options(): unknown option(s) {unknown}; "
                            f"options are {list(_OPTIONS)}")
        self.cls = cls
        self.procs = opts.get("procs", 1)
        self.num_replicas = opts.get("num_replicas", 1)
        for what in ("procs", "num_replicas"):
            v = getattr(self, what)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{cls.__qualname__}.options(): {what} is an int >= 1, "
                                 f"not {v!r}")
        self.hosts = opts.get("hosts")
        if self.hosts is not None and not isinstance(self.hosts, HostMesh):
            raise TypeError(f"options(hosts=...) takes a HostMesh, not {self.hosts!r}")
        self.name = opts.get("name") or f"{cls.__name__}-svc{next(_names)}"
        self.retry = bool(opts.get("retry", True))
        self.restart = opts.get("restart", DEFAULT_RESTART)
        if not isinstance(self.restart, RestartPolicy):
            raise TypeError(f"options(restart=...) takes a RestartPolicy, not "
                            f"{self.restart!r}")
        self.wait_timeout = float(opts.get("wait_timeout", 30.0))

    def as_service(self, *args: Any, **kwargs: Any) -> "Future[Service]":
        """Starts the replicas; a Future of the Service once every replica's actor is up
        (``await`` it, or ``.get()``). If one fails to start, those started are stopped
        and the Future raises why."""
        check_spawn(self.cls, args, kwargs)
        check_endpoint_names(self.cls)
        service = Service(self, args, kwargs)  # its replicas spawn in this context

        async def start() -> Service:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(loop.run_in_executor(None, r.keeper.start_first)
                  for r in service._replicas),
                return_exceptions=True)
            failed = [e for e in results if isinstance(e, BaseException)]
            if failed:
                await service.shutdown()
                raise failed[0]
            return service

        return Started(start())


class _Replica:
    """One replica: its Keeper, and the calls in flight to it through the service."""

    def __init__(self, index: int, keeper: Keeper) -> None:
        self.index = index
        self.keeper = keeper
        self.in_flight = 0  # guarded by the service's lock
        self.suspect: Any = None  # the incarnation a call saw fail (SR-3); service lock

    def healthy(self) -> bool:
        k = self.keeper
        return k.state == "running" and k.mesh is not None and k.mesh is not self.suspect


class Service:
    """R replicas of an actor (see the module doc). Endpoints are attributes:
    ``service.ep.route(...)``, ``.fanout(...)``, ``.call_one(..., replica=i)``."""

    def __init__(self, opts: ServiceOptions, args: tuple, kwargs: dict) -> None:
        self._opts = opts
        self._cls = opts.cls
        self.name = opts.name
        self._lock = threading.Lock()  # guards _rr, _sessions, _closed, replicas' counts
        self._rr = 0
        self._sessions: Dict[str, int] = {}
        self._closed = False
        hosts = opts.hosts if opts.hosts is not None else this_host()
        self._replicas = []
        for i in range(opts.num_replicas):
            def respawn(gen: int, i: int = i) -> Tuple[Any, Any]:
                pm = hosts.spawn_procs(per_host={"procs": opts.procs})
                return pm, pm.spawn(f"{self.name}-r{i}-g{gen}", opts.cls, *args, **kwargs)

            keeper = Keeper(f"service '{self.name}' replica {i}", opts.cls, respawn,
                            opts.restart, quiet=True)
            self._replicas.append(_Replica(i, keeper))

    @property
    def num_replicas(self) -> int:
        return len(self._replicas)

    def __getattr__(self, name: str) -> "ServiceEndpoint":
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in endpoints_of(self._cls):
            raise AttributeError(f"{self._cls.__qualname__} has no endpoint '{name}'")
        ep = self.__dict__[name] = ServiceEndpoint(self, name)
        return ep

    def replica(self, index: int) -> "_ReplicaView":
        """Replica ``index``: ``service.replica(i).ep.call_one(...)``."""
        if not isinstance(index, int) or not 0 <= index < len(self._replicas):
            raise IndexError(f"service '{self.name}' has replicas 0..{len(self._replicas) - 1}"
                             f", not {index!r}")
        return _ReplicaView(self, index)

    # --- sessions -------------------------------------------------------------------------

    def start_session(self) -> str:
        """A new session id: route(..., sess_id=it) calls go to one replica (SR-1)."""
        return uuid.uuid4().hex

    def terminate_session(self, sess_id: str) -> None:
        with self._lock:
            self._sessions.pop(sess_id, None)

    def session(self) -> "_Session":
        """``async with service.session():`` (or ``with``): the route() calls made in it go
        to one replica while that replica is healthy (SR-1)."""
        return _Session(self)

    # --- routing --------------------------------------------------------------------------

    def _describe(self) -> str:
        return ", ".join(f"replica {r.index} {r.keeper.state}"
                         + (f" ({r.keeper.error})" if r.keeper.error else "")
                         for r in self._replicas)

    def _check_open(self) -> None:
        if self._closed:
            raise ServiceError(f"service '{self.name}' was shut down", self.name)

    def _try_pick(self, sess: Optional[str], exclude: List[_Replica],
                  index: Optional[int]) -> Optional[Tuple[_Replica, Any]]:
        """SR-1 (or replica ``index``): the replica and its incarnation, with one more call
        in flight; None when none fits now."""
        with self._lock:
            self._check_open()
            if index is not None:
                r = self._replicas[index]
                chosen = r if r.healthy() else None
            else:
                healthy = [r for r in self._replicas if r.healthy() and r not in exclude]
                chosen = None
                if sess is not None:
                    i = self._sessions.get(sess)
                    if i is not None and self._replicas[i] in healthy:
                        chosen = self._replicas[i]
                if chosen is None and healthy:
                    least = min(r.in_flight for r in healthy)
                    ties = [r for r in healthy if r.in_flight == least]
                    after = [r for r in ties if r.index >= self._rr]
                    chosen = (after or ties)[0]
                    self._rr = chosen.index + 1
                if chosen is not None and sess is not None:
                    self._sessions[sess] = chosen.index
            if chosen is None:
                return None
            chosen.in_flight += 1
            return chosen, chosen.keeper.mesh

    def _snapshot(self) -> List[Tuple[str, Any]]:
        return [(r.keeper.state, r.keeper.mesh) for r in self._replicas]

    async def _until_changed(self, seen: List[Tuple[str, Any]], deadline: float) -> None:
        """Waits until a replica's keeper changes from `seen` (the states the caller checked:
        a replica restarted, failed or stopped; SR-5), or the deadline. It registers with every
        keeper first and compares after, so a change since the caller's check is not lost."""
        loop = asyncio.get_running_loop()
        changes = [r.keeper.watch(loop) for r in self._replicas]
        try:
            if self._snapshot() == seen:
                await asyncio.wait(changes, timeout=max(0.0, deadline - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            for c in changes:
                c.cancel()

    async def _acquire(self, sess: Optional[str], exclude: List[_Replica],
                       index: Optional[int] = None) -> Tuple[_Replica, Any]:
        deadline = time.monotonic() + self._opts.wait_timeout
        while True:
            seen = self._snapshot()
            got = self._try_pick(sess, exclude, index)
            if got is not None:
                return got
            states = {r.keeper.state for r in self._replicas}
            if states <= {"failed", "stopped"} or time.monotonic() > deadline:
                which = "replica %d is" % index if index is not None else "no replica is"
                raise ServiceError(f"service '{self.name}': {which} healthy (waited at most "
                                   f"{self._opts.wait_timeout:g} s): {self._describe()}",
                                   self.name, index)
            await self._until_changed(seen, deadline)

    def _release(self, r: _Replica) -> None:
        with self._lock:
            r.in_flight -= 1

    def _failed(self, r: _Replica, mesh: Any, what: str, e: BaseException) -> ServiceError:
        """A call on replica ``r`` (incarnation ``mesh``) failed with SupervisionError ``e``:
        out of routing now (SR-3); the error to raise."""
        with self._lock:
            if r.keeper.mesh is mesh:
                r.suspect = mesh
        r.keeper.call_failed(mesh, e)
        return ServiceError(f"service '{self.name}' replica {r.index}: {what} failed: {e}",
                            self.name, r.index, e)

    async def _run(self, r: _Replica, mesh: Any, name: str, args: tuple,
                   kwargs: dict) -> Any:
        ep = getattr(mesh, name)
        if self._opts.procs == 1:
            result = await ep.call_one(*args, **kwargs)
        else:  # every proc of the replica runs it
            result = await ep.call(*args, **kwargs)
        if r.keeper.auto_checkpoint:
            await r.keeper.checkpoint_async(mesh)  # RS-4
        return result

    async def _route(self, name: str, args: tuple, kwargs: dict, sess: Optional[str],
                     retry: bool) -> Any:
        tried: List[_Replica] = []
        while True:
            r, mesh = await self._acquire(sess, tried)
            try:
                return await self._run(r, mesh, name, args, kwargs)
            except SupervisionError as e:
                if isinstance(e, ActorError) or self._closed:
                    raise
                err = self._failed(r, mesh, f"{name}()", e)
                if not retry or tried:
                    raise err from e
                tried.append(r)
                logger.warning("%s; sending it again to another replica (SR-4)", err)
            finally:
                self._release(r)

    async def _call_on(self, index: int, name: str, args: tuple, kwargs: dict) -> Any:
        r, mesh = await self._acquire(None, [], index)
        try:
            return await self._run(r, mesh, name, args, kwargs)
        except SupervisionError as e:
            if isinstance(e, ActorError) or self._closed:
                raise
            raise self._failed(r, mesh, f"{name}()", e) from e
        finally:
            self._release(r)

    async def _fanout(self, name: str, args: tuple, kwargs: dict) -> List[Any]:
        deadline = time.monotonic() + self._opts.wait_timeout
        while True:
            seen = self._snapshot()
            with self._lock:
                self._check_open()
                targets = [(r, r.keeper.mesh) for r in self._replicas if r.healthy()]
                for r, _ in targets:
                    r.in_flight += 1
            if targets:
                break
            states = {r.keeper.state for r in self._replicas}
            if states <= {"failed", "stopped"} or time.monotonic() > deadline:
                raise ServiceError(f"service '{self.name}': no replica is healthy (waited at "
                                   f"most {self._opts.wait_timeout:g} s): {self._describe()}",
                                   self.name)
            await self._until_changed(seen, deadline)
        try:
            results = await asyncio.gather(
                *(self._run(r, m, name, args, kwargs) for r, m in targets),
                return_exceptions=True)
        finally:
            for r, _ in targets:
                self._release(r)
        for (r, m), res in zip(targets, results):
            if isinstance(res, SupervisionError) and not isinstance(res, ActorError) \
                    and not self._closed:
                raise self._failed(r, m, f"{name}() (fanout)", res) from res
            if isinstance(res, BaseException):
                raise res
        return list(results)

    # --- status, shutdown -----------------------------------------------------------------

    def status(self) -> List[Dict[str, Any]]:
        """Per replica: ``index``, ``healthy``, ``state`` (running, restarting, failed,
        stopped), ``in_flight``, ``restarts``, ``mesh`` (its actor mesh's name), ``procs``
        (per proc: ``rank``, ``host``, ``pid``) and ``last_failure`` (a report, or None)."""
        out = []
        for r in self._replicas:
            k = r.keeper
            with self._lock:
                healthy, in_flight = r.healthy(), r.in_flight
            mesh = k.mesh
            procs = []
            if mesh is not None:
                for rank in range(len(mesh)):
                    _, pid, host, _, _ = mesh._core.rank_info(rank)
                    procs.append({"rank": rank, "host": host, "pid": pid})
            out.append({"index": r.index, "healthy": healthy, "state": k.state,
                        "in_flight": in_flight, "restarts": k.restarts,
                        "mesh": mesh.name if mesh is not None else None, "procs": procs,
                        "last_failure": k.failure.report() if k.failure is not None
                        else None})
        return out

    def shutdown(self) -> "Future[None]":
        """Stops every replica's actors and procs (SR-6); a Future to await or get()."""
        with self._lock:
            self._closed = True
        replicas = self._replicas

        async def stop() -> None:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(loop.run_in_executor(None, r.keeper.stop) for r in replicas),
                return_exceptions=True)
            for e in results:
                if isinstance(e, BaseException):
                    raise e

        return Started(stop())

    def __reduce__(self):
        raise TypeError(f"service '{self.name}' is used from the process that started it; "
                        f"pass a replica's actor mesh instead")

    def __repr__(self) -> str:
        return f"<Service '{self.name}' of {self._cls.__qualname__}: {self._describe()}>"


class ServiceEndpoint:
    """One endpoint of a Service, with its adverbs (SR-1..SR-5). ``route`` and ``call_one``
    take the reserved keywords ``sess_id`` / ``retry`` and ``replica``."""

    def __init__(self, service: Service, name: str) -> None:
        self._service = service
        self._name = name

    def route(self, *args: Any, sess_id: Optional[str] = None, retry: Optional[bool] = None,
              **kwargs: Any) -> "Future[Any]":
        """One healthy replica runs it (SR-1), sent once more on another if that replica
        fails (SR-4)."""
        svc = self._service
        svc._check_open()
        sess = sess_id if sess_id is not None else _session.get()
        if retry is None:
            retry = svc._opts.retry and _retries(svc._cls, self._name)
        return Started(svc._route(self._name, args, kwargs, sess, bool(retry)))

    def fanout(self, *args: Any, **kwargs: Any) -> "Future[List[Any]]":
        """Every healthy replica runs it; their results in replica order (SR-2)."""
        self._service._check_open()
        return Started(self._service._fanout(self._name, args, kwargs))

    def call_one(self, *args: Any, replica: Optional[int] = None, **kwargs: Any
                 ) -> "Future[Any]":
        """Replica ``replica`` runs it (waits, bounded, while it restarts; never resent)."""
        svc = self._service
        if replica is None:
            raise TypeError(f"call_one() on service '{svc.name}' names its replica: "
                            f"call_one(..., replica=i), or use route()")
        svc.replica(replica)  # IndexError for a wrong one
        svc._check_open()
        return Started(svc._call_on(replica, self._name, args, kwargs))

    def __repr__(self) -> str:
        return f"<ServiceEndpoint {self._name} of service '{self._service.name}'>"


class _ReplicaView:
    """``service.replica(i)``: its endpoints' call_one goes to replica i."""

    def __init__(self, service: Service, index: int) -> None:
        self._service = service
        self._index = index

    def __getattr__(self, name: str) -> "_ReplicaEndpoint":
        if name.startswith("_"):
            raise AttributeError(name)
        return _ReplicaEndpoint(getattr(self._service, name), self._index)

    @property
    def actor_mesh(self) -> Any:
        """The replica's current actor mesh (waits, bounded, while it restarts)."""
        return self._service._replicas[self._index].keeper.current()


class _ReplicaEndpoint:
    """``service.replica(i).ep``: call_one goes to replica i."""

    def __init__(self, ep: ServiceEndpoint, index: int) -> None:
        self._ep = ep
        self._index = index

    def call_one(self, *args: Any, **kwargs: Any) -> "Future[Any]":
        return self._ep.call_one(*args, replica=self._index, **kwargs)


class _Session:
    """See Service.session()."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._token: Any = None
        self.sess_id: Optional[str] = None

    def __enter__(self) -> "_Session":
        self.sess_id = self._service.start_session()
        self._token = _session.set(self.sess_id)
        return self

    def __exit__(self, *exc: Any) -> None:
        _session.reset(self._token)
        self._service.terminate_session(self.sess_id)

    async def __aenter__(self) -> "_Session":
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__()


def _options(cls: type, opts: Dict[str, Any]) -> ServiceOptions:
    return ServiceOptions(cls, opts)


_endpoint.set_service_options(_options)
