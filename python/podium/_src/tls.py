"""TLS settings given as Python arguments (``attach_to_workers(ca=..., private_key=...)``,
``run_worker_loop_forever(...)``).

The C++ runtime reads TLS from the environment when it starts (``PODIUM_TLS_CERT``,
``PODIUM_TLS_KEY``, ``PODIUM_TLS_CA``: channel CH-9, docs/multihost.md), and every proc it
starts inherits the variables, as it inherits ``PODIUM_SECRET``. The arguments therefore
become those variables, before the runtime of this process starts: a path stays a path
(made absolute, since procs may start elsewhere), PEM bytes travel as the variable's value.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

TRUST_ALL = "trust_all_connections"
ENV = ("PODIUM_TLS_CERT", "PODIUM_TLS_KEY", "PODIUM_TLS_CA")
# `podium worker --help`: a worker reads the secret and TLS from the environment, as every
# podium process does, rather than from options of its own.
WORKER_HELP = ("The job's secret comes from PODIUM_SECRET or PODIUM_SECRET_FILE, and TLS from "
               "PODIUM_TLS_CERT, PODIUM_TLS_KEY and PODIUM_TLS_CA (PEM file paths; all three or "
               "none), as for every podium process: set the same ones as on the controller "
               "(docs/multihost.md).")


def _value(x: Any, what: str, who: str) -> str:
    if isinstance(x, (bytes, bytearray, memoryview)):
        text = bytes(x).decode("ascii", errors="strict")
        if "-----BEGIN" not in text:
            raise ValueError(f"{who}: {what} bytes are not PEM (no '-----BEGIN' line)")
        return text
    if isinstance(x, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(x))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{who}: {what} {path}: no such file")
        return path
    raise TypeError(f"{who}: {what} is PEM bytes or a path, not {type(x).__name__}")


def settings(ca: Any, private_key: Any, who: str) -> Optional[Dict[str, str]]:
    """The PODIUM_TLS_* variables that ``ca`` and ``private_key`` ask for, or None when they
    ask for nothing (``ca`` is ``"trust_all_connections"`` or None and there is no key: the
    environment alone decides)."""
    no_ca = ca is None or (isinstance(ca, str) and ca == TRUST_ALL)
    if no_ca and private_key is None:
        return None
    if no_ca or private_key is None:
        raise ValueError(
            f"{who}: TLS needs both ca= (PEM bytes or the path of the CA bundle that signs every "
            f"process's certificate) and private_key= (PEM bytes or the path of a PEM file with "
            f"this process's private key and its certificate chain)")
    key = _value(private_key, "private_key", who)
    return {"PODIUM_TLS_CERT": key, "PODIUM_TLS_KEY": key,
            "PODIUM_TLS_CA": _value(ca, "ca", who)}


def configure(ca: Any, private_key: Any, who: str, running: bool) -> None:
    """Puts the TLS settings of ``ca`` and ``private_key`` in this process's environment for
    the runtime to read when it starts. Once it runs (``running``), settings that differ from
    the ones it started with raise RuntimeError."""
    want = settings(ca, private_key, who)
    if want is None:
        return
    if running:
        if any(os.environ.get(k) != v for k, v in want.items()):
            raise RuntimeError(
                f"{who}: ca= and private_key= must be given before podium starts in this "
                f"process (it runs with {_describe()})")
        return
    os.environ.update(want)


def _describe() -> str:
    if not any(os.environ.get(k) for k in ENV):
        return "no TLS"
    return "other TLS settings"
