"""Where the debugger's prompt reads and writes: the exchange calls of its client (LocalIO),
podium.debug() in the controller process or a `podium debug` command attached to it."""

from __future__ import annotations

import abc
import asyncio
from typing import List, Optional


class DebugIO(abc.ABC):
    """Where the prompt reads and writes."""

    @abc.abstractmethod
    async def input(self, prompt: str = "") -> str:
        """The user's next line, after showing ``prompt``."""

    @abc.abstractmethod
    async def output(self, text: str) -> None:
        """Shows ``text`` to the user."""

    @abc.abstractmethod
    async def close(self, text: str = "") -> None:
        """Shows ``text`` and ends the prompt's connection."""


class IOClosed(Exception):
    """The prompt's reader is gone (disconnected, or replaced by a new prompt)."""


class LocalIO(DebugIO):
    """The prompt of one client: each exchange(line) hands one line in and returns what the
    prompt wrote until it wants the next one."""

    def __init__(self) -> None:
        self.lines: "asyncio.Queue[Optional[str]]" = asyncio.Queue()
        self.buffer: List[str] = []
        self.turn = asyncio.Event()  # the prompt waits for a line, or has finished
        self.done = False
        self.closed = asyncio.Event()  # set with done
        self.replaced = False  # another prompt took over (its client is told: watch_prompt)

    async def input(self, prompt: str = "") -> str:
        self.buffer.append(prompt)
        self.turn.set()
        line = await self.lines.get()
        if line is None:
            raise IOClosed()
        return line

    async def output(self, text: str) -> None:
        self.buffer.append(text)

    async def close(self, text: str = "") -> None:
        self.buffer.append(text)
        self.done = True
        self.turn.set()
        self.closed.set()

    def take(self) -> str:
        text = "".join(self.buffer)
        self.buffer.clear()
        return text
