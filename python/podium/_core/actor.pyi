"""podium C++ layer actor"""



def serve_python_actors() -> None:
    """
    Registers the actor type 'python' and lets spawn requests queue for this process's spawner thread (next_spawn).
    """

def set_driving(on: bool) -> None:
    """
    Whether actor threads run the proc's loop while they wait for their next message.
    """

def close_spawns() -> None:
    """
    Fails queued and later spawns of Python actors; next_spawn returns None.
    """

def next_spawn(timeout_s: float | None = None) -> SpawnRequest:
    """
    The next spawn request, or None after timeout_s (None: no timeout) or close_spawns().
    """

class SpawnRequest:
    @property
    def inbox(self) -> Inbox: ...

    @property
    def parts(self) -> list: ...

    def constructed(self) -> None:
        """__init__ has run: the spawn succeeds."""

    def failed(self, arg: str, /) -> None:
        """__init__ raised: the spawn fails with `message`."""

class InboxItem:
    @property
    def kind(self) -> str: ...

    @property
    def failure(self) -> dict: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def labels(self) -> list[str]: ...

    @property
    def sizes(self) -> list[int]: ...

    @property
    def reply_port(self) -> str: ...

    @property
    def parts(self) -> list: ...

    def fields(self) -> tuple:
        """
        (endpoint, rank, reply_port, labels, sizes, parts) of a call, in one step; the parts move out of the item.
        """

    def stopped(self) -> None: ...

class Inbox:
    @property
    def actor_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def index(self) -> int: ...

    def next(self, timeout_s: float | None = None, supervise_only: bool = False) -> InboxItem | None:
        """
        The next item (supervision items first), or None after timeout_s or once closed (timeout_s None: only once closed; close() wakes the wait). supervise_only: the next supervision item only; calls and stops stay queued.
        """

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...

    def reply(self, port: str, rank: int, parts: object) -> None:
        """
        Answers a call. When more calls are queued, the reply may wait up to the channel's flush_later_delay (50 µs) to share a write with the next ones.
        """

    def reply_error(self, port: str, rank: int, message: str) -> None: ...

    def reply_stopped(self, port: str, rank: int, message: str) -> None:
        """Answers a call that the actor's stop cancelled."""

    def event_fd(self) -> int:
        """
        An eventfd written on every push and on close (asyncio actors watch it).
        """

    def drain_event(self) -> None: ...

    def reply_failure(self, arg0: str, arg1: int, /) -> None:
        """Answers with the error that failed this actor."""

    def fail(self, arg: str, /) -> None:
        """
        Fails the actor: queued calls and later ones are refused with `message`, and the owner of its mesh is told.
        """

    @property
    def failed(self) -> bool: ...

    def finished(self) -> None: ...
