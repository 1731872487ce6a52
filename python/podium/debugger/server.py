"""The debug server: the TCP listener of the debug controller that ``podium debug`` (or any
line-based client such as ``nc``, on loopback) connects to, and its client side.

Where it listens: PODIUM_DEBUG_SERVER_HOST (default ``localhost``) and
PODIUM_DEBUG_SERVER_PORT (default 27000); Monarch's MONARCH_DEBUG_SERVER_HOST / _PORT are read
when podium's are unset. The first line a client receives says whether it must authenticate.

  DB-8 A debug server listening on any address that is not loopback (or with
    PODIUM_DEBUG_SERVER_AUTH=1) requires every client to prove the job's secret before it
    reads a command: the server sends a fresh 32-byte nonce, the client answers with
    HMAC-SHA256(secret, "podium-debug-client" + nonce); a wrong or late answer (10 s, at most
    256 bytes) closes the connection with a warning naming the peer. Without a secret (an
    insecure job) it refuses to listen off loopback.
  DB-9 A server that cannot listen (port in use, refused) does not stop breakpoints: the
    sessions still open, a warning on the controller's stderr names the address and cause
    once, and podium.debug() still reaches them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import secrets
import selectors
import socket
import sys
import time
from typing import Any, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src.job.secret import _runtime_secret
from podium.debugger.prompt_io import DebugIO, IOClosed
from podium.debugger.logs import MODE_LOGS, serve as logs_serve
from podium.debugger.shell import MODE_EXEC

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 27000
HELLO_OPEN = "podium-debug v1 open"
HELLO_AUTH = "podium-debug v1 auth "
AUTH_CONTEXT = b"podium-debug-client"
AUTH_TIMEOUT_S = 10.0
AUTH_LINE_MAX = 256
MODE_PROMPT = "podium-prompt"
MODE_DASHBOARD = "podium-dashboard"  # `podium dashboard`: start the dashboard, get its URL
MODE_WAIT_S = 0.5


def _env(name: str) -> Optional[str]:
    return os.environ.get(f"PODIUM_{name}") or os.environ.get(f"MONARCH_{name}") or None


def configured_address() -> Tuple[str, int]:
    host = _env("DEBUG_SERVER_HOST") or DEFAULT_HOST
    port = _env("DEBUG_SERVER_PORT")
    return host, int(port) if port else DEFAULT_PORT


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                               for a in addrs)


def job_secret() -> Optional[bytes]:
    """The job's secret as this process holds it (PODIUM_SECRET_FILE, PODIUM_SECRET, or the
    one the runtime generated: docs/security.md), or None."""
    path = os.environ.get("PODIUM_SECRET_FILE")
    if path:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n")
    value = os.environ.get("PODIUM_SECRET")
    if value:
        return value.encode()
    try:
        return _runtime_secret()
    except Exception:
        return None


def proof(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, AUTH_CONTEXT + nonce, hashlib.sha256).hexdigest()


class TcpIO(DebugIO):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: list = []  # lines read before the prompt started

    async def input(self, prompt: str = "") -> str:
        if prompt:
            await self.output(prompt)
        if self.pending:
            return self.pending.pop(0)
        data = await self.reader.readline()
        if not data.endswith(b"\n"):
            raise IOClosed()
        return data.decode(errors="replace").rstrip("\r\n")

    async def output(self, text: str) -> None:
        if not text:
            return
        try:
            self.writer.write(text.encode())
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as e:
            raise IOClosed() from e

    async def close(self, text: str = "") -> None:
        try:
            await self.output(text)
        except IOClosed:
            pass
        self.writer.close()


class DebugServer:
    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self.host, self.port = configured_address()
        self.auth = (os.environ.get("PODIUM_DEBUG_SERVER_AUTH") == "1"
                     or not is_loopback(self.host))
        self.server: Optional[asyncio.base_events.Server] = None
        self.error: Optional[str] = None
        self.lock = asyncio.Lock()

    def address(self) -> Tuple[str, int, bool]:
        if self.server is None:
            raise RuntimeError(f"the debug server is not listening: {self.error}")
        return self.host, self.port, self.auth

    async def start(self) -> None:
        async with self.lock:
            if self.server is not None or self.error is not None:
                return
            try:
                self.secret = job_secret() if self.auth else None
                if self.auth and not self.secret:
                    raise PermissionError(
                        f"{self.host} is not a loopback address, and this job has no secret for "
                        f"clients to prove (PODIUM_INSECURE?); set PODIUM_DEBUG_SERVER_HOST to "
                        f"a loopback address")
                self.server = await asyncio.start_server(self._client, self.host, self.port)
                if self.port == 0:
                    self.port = self.server.sockets[0].getsockname()[1]
                if self.auth:  # say where clients find the secret (never the secret itself)
                    path = os.environ.get("PODIUM_SECRET_FILE") or _mesh.secret_file()
                    where = (f"PODIUM_SECRET_FILE={path}" if path
                             else "PODIUM_SECRET, as this controller's")
                    sys.stderr.write(f"podium: debugger: the debug server listens on "
                                     f"{self.host}:{self.port}; `podium debug` and `podium "
                                     f"exec` must prove the job's secret ({where})\n")
                    sys.stderr.flush()
            except Exception as e:  # DB-9
                self.error = f"{type(e).__name__}: {e}"
                sys.stderr.write(
                    f"podium: debugger: the debug server cannot listen on {self.host}:"
                    f"{self.port} ({self.error}); breakpoints still stop actors, but `podium "
                    f"debug` cannot reach this job: use podium.debug() in the controller, or "
                    f"set PODIUM_DEBUG_SERVER_PORT\n")
                sys.stderr.flush()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if self.auth:
                if not await self._authenticate(reader, writer, peer):
                    return
            else:
                writer.write((HELLO_OPEN + "\n").encode())
            io = TcpIO(reader, writer)
            # The client's first line may say what it wants: `podium debug` asks for the
            # prompt, `podium exec` sends its request (shell.py); a line client such as nc
            # says nothing and gets the prompt after MODE_WAIT_S, its first line (if it typed
            # one that soon) being its first command.
            try:
                first = await asyncio.wait_for(reader.readline(), MODE_WAIT_S)
            except asyncio.TimeoutError:
                first = None
            if first is not None:
                text = first.decode(errors="replace").rstrip("\r\n")
                if text.startswith(MODE_EXEC):
                    await self.controller.exec_request(io, text)
                    return
                if text == MODE_DASHBOARD:
                    await self.controller.dashboard_request(io)
                    return
                if text.startswith(MODE_LOGS):  # `podium logs` (logs.py, PL-3)
                    await logs_serve(io, text)
                    return
                if first and text != MODE_PROMPT:
                    io.pending.append(text)
                elif not first:  # closed at once
                    writer.close()
                    return
            await self.controller.run_prompt(io)
        except Exception as e:
            sys.stderr.write(f"podium: debugger: client {peer}: {type(e).__name__}: {e}\n")
            writer.close()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            peer: Any) -> bool:
        """DB-8."""
        nonce = secrets.token_bytes(32)
        writer.write((HELLO_AUTH + nonce.hex() + "\n").encode())
        try:
            await writer.drain()
            answer = await asyncio.wait_for(reader.readuntil(b"\n"), AUTH_TIMEOUT_S)
            ok = (len(answer) <= AUTH_LINE_MAX and hmac.compare_digest(
                answer.strip(), proof(self.secret, nonce).encode()))
        except (asyncio.TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ConnectionError, ValueError):
            ok = False
        if not ok:
            sys.stderr.write(f"podium: debugger: refused a client at {peer}: it did not prove "
                             f"the job's secret\n")
            sys.stderr.flush()
            try:
                writer.write(b"podium debug: authentication failed\n")
                await writer.drain()
            except ConnectionError:
                pass
            writer.close()
            return False
        writer.write(b"podium-debug v1 authenticated\n")
        return True


# --- the client: `podium debug` ---------------------------------------------------------------


def connect(host: str, port: int, wait_s: float, secret_file: Optional[str]) -> socket.socket:
    """A connection to the debug server, authenticated when it asks (DB-8). Retries for
    ``wait_s`` seconds while nothing listens (the controller spawns the debug controller at
    the first breakpoint)."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ConnectionRefusedError(
                    f"nothing listens on {host}:{port}: no actor of this job has stopped at a "
                    f"breakpoint yet, or its debug server listens elsewhere "
                    f"(PODIUM_DEBUG_SERVER_HOST / _PORT)") from None
            if not said:
                print(f"podium debug: waiting for the debug server at {host}:{port}",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(0.2)
    f = sock.makefile("rb", buffering=0)  # unbuffered: what follows is relay()'s
    hello = f.readline(AUTH_LINE_MAX).decode(errors="replace").rstrip("\r\n")
    if hello.startswith(HELLO_AUTH):
        nonce = bytes.fromhex(hello[len(HELLO_AUTH):])
        secret = _client_secret(secret_file)
        if secret is None:
            sock.close()
            raise PermissionError(f"the debug server at {host}:{port} asks for the job's "
                                  f"secret: set PODIUM_SECRET_FILE or give --secret-file")
        sock.sendall((proof(secret, nonce) + "\n").encode())
        answer = f.readline(AUTH_LINE_MAX).decode(errors="replace").strip()
        if answer != "podium-debug v1 authenticated":
            sock.close()
            raise PermissionError(f"the debug server at {host}:{port} refused the secret: "
                                  f"{answer or 'connection closed'}")
    elif hello != HELLO_OPEN:
        sock.close()
        raise ConnectionError(f"{host}:{port} is not a podium debug server (it said "
                              f"{hello[:80]!r})")
    sock.settimeout(None)
    return sock


def ask_prompt(sock: socket.socket) -> None:
    sock.sendall((MODE_PROMPT + "\n").encode())


def _client_secret(secret_file: Optional[str]) -> Optional[bytes]:
    if secret_file:
        with open(secret_file, "rb") as f:
            return f.read().rstrip(b"\r\n")
    return job_secret()


def relay(sock: socket.socket) -> int:
    """Copies the terminal's lines to the server and its text to the terminal until the
    server closes (quit) or the terminal ends."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "sock")
    try:
        sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    except (ValueError, OSError):  # no terminal: the server's text only
        pass
    out = sys.stdout.fileno()
    while True:
        for key, _ in sel.select():
            if key.data == "sock":
                data = sock.recv(65536)
                if not data:
                    return 0
                os.write(out, data)
            else:
                data = os.read(sys.stdin.fileno(), 65536)
                if not data:  # end of input: the server ends the prompt and closes
                    sel.unregister(sys.stdin.fileno())
                    sock.shutdown(socket.SHUT_WR)
                else:
                    sock.sendall(data)
