"""The port mapper: tells clients on which ports the service's front ends listen.

A client connects to ``imq.portmapper.port`` (7676) and the port mapper writes its table at
once, in the original broker's text format (a version line, one ``name protocol type port``
line per service, a line ``.``), then closes. ``lookup_services`` is the client;
``format_table``/``parse_table`` are the pure codec both use; ``register`` and
``unregister`` change the table while the port mapper runs.

Services: ``portmapper`` (itself, always first), ``jms`` / ``ssljms`` (the host broker's
connection service, ``tcp`` / ``tls``), ``bridgeadmin`` (the admin command port), ``stomp``
(the STOMP bridge, when it runs), ``metrics`` (when imq.metrics.port is set).

Rule: every connection counts as not logged in: it is closed ``_LINGER`` seconds after its
answer at the latest, and one address holds at most
imq.portmapper.max_unauthenticated_per_address of them.

Design notes: docs/operations.md#internals-adminportmapperpy.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
from dataclasses import dataclass
from typing import cast

from ..guard import DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS, AddressLimit, Admission, Listener, listen, write_eof
from ..jms.errors import TransportException
from ..netloop import NetLoop
from ..version import __version__

log = logging.getLogger(__name__)

PORTMAPPER_VERSION = 101
DEFAULT_PORT = 7676
END = "."
_FIELD = re.compile(r"[!-~]+\Z")  # printable ASCII, no space
_CLIENT_LINE_LIMIT = 128
_LINGER = 2.0  # seconds to wait for the client's close
_MAX_TABLE = 64 * 1024


class PortMapperError(TransportException, code="PORTMAPPER"):
    """The port mapper cannot be reached or answered something that is not a table."""


@dataclass(frozen=True)
class ServiceEntry:
    """One service line: ``name protocol type port``."""

    name: str
    protocol: str
    type: str
    port: int

    def __post_init__(self) -> None:
        for field in (self.name, self.protocol, self.type):
            if not isinstance(field, str) or not _FIELD.match(field):
                raise ValueError(f"service entry field {field!r} must be printable ASCII without spaces")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"service port {self.port!r} must be 0..65535")

    def line(self) -> str:
        return f"{self.name} {self.protocol} {self.type} {self.port}"


def format_table(instance_name: str, entries: list[ServiceEntry], version: str = __version__) -> bytes:
    """The bytes the port mapper writes to each client."""
    lines = [f"{PORTMAPPER_VERSION} {instance_name} {version}"] + [e.line() for e in entries] + [END]
    return ("\n".join(lines) + "\n").encode("ascii")


def parse_table(data: bytes) -> tuple[str, list[ServiceEntry]]:
    """(instance name, services) from a table; PortMapperError naming the bad line."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise PortMapperError("the port mapper's answer is not ASCII text") from None
    lines = text.split("\n")
    head = lines[0].split(" ")
    if len(head) != 3 or not head[0].isdigit():
        raise PortMapperError(f"line 1 of the port mapper's answer is not a version line: {lines[0][:80]!r}")
    if int(head[0]) != PORTMAPPER_VERSION:
        raise PortMapperError(
            f"port mapper version {head[0]} is not supported (this client reads {PORTMAPPER_VERSION})"
        )
    entries: list[ServiceEntry] = []
    for number, line in enumerate(lines[1:], start=2):
        if line.rstrip("\r") == END:
            return head[1], entries
        if not line and number == len(lines):
            break  # the text ended
        fields = line.rstrip("\r").split(" ")
        try:
            # the original may append "[properties]" after the port: ignore it
            entries.append(ServiceEntry(fields[0], fields[1], fields[2], int(fields[3])))
        except (IndexError, ValueError):
            raise PortMapperError(
                f"line {number} of the port mapper's answer is not 'name protocol type port': {line[:80]!r}"
            ) from None
    raise PortMapperError("the port mapper's answer ended without its '.' line")


def lookup_services(host: str, port: int = DEFAULT_PORT, timeout: float = 5.0) -> list[ServiceEntry]:
    """The services the port mapper at ``host:port`` lists."""
    return lookup_table(host, port, timeout)[1]


def lookup_table(host: str, port: int = DEFAULT_PORT, timeout: float = 5.0) -> tuple[str, list[ServiceEntry]]:
    """(instance name, services) of the port mapper at ``host:port``."""
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(f"{PORTMAPPER_VERSION}\n".encode())
            data = b""
            while b"\n.\n" not in data:
                try:
                    chunk = sock.recv(4096)
                except OSError:
                    if not data:
                        raise
                    break  # reset after its answer: read what came
                if not chunk:
                    break
                data += chunk
                if len(data) > _MAX_TABLE:
                    raise PortMapperError(f"the port mapper at {where} sent more than {_MAX_TABLE} bytes")
    except PortMapperError:
        raise
    except OSError as exc:
        raise PortMapperError(
            f"cannot reach the port mapper at {where} ({exc.strerror or exc}); "
            "is the service (imqbridgemgr serve) running there?"
        ) from None
    try:
        return parse_table(data)
    except PortMapperError as exc:
        raise PortMapperError(f"{where}: {exc}") from None


def find_service(host: str, port: int, names: tuple[str, ...], timeout: float = 5.0) -> ServiceEntry:
    """The first service of ``names`` listed at ``host:port``; PortMapperError naming what is there."""
    instance, entries = lookup_table(host, port, timeout)
    for name in names:
        for entry in entries:
            if entry.name == name:
                return entry
    listed = ", ".join(e.name for e in entries) or "none"
    raise PortMapperError(
        f"broker {instance} at {host}:{port} offers no {' or '.join(names)} service (its services: {listed})"
    )


class _Answer(asyncio.Protocol):
    """One client: write the table, read (and ignore) its version line, close."""

    def __init__(self, table: bytes, admission: Admission) -> None:
        self.table = table
        self.admission = admission
        self.read = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tcp = cast(asyncio.Transport, transport)  # a stream server's: always a Transport
        tcp.write(self.table)
        write_eof(tcp)
        asyncio.get_running_loop().call_later(_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        self.read += len(data)
        if self.read > _CLIENT_LINE_LIMIT and self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        if self.transport is not None:
            self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.release()


class PortMapper:
    """The port mapper server, on the service's :class:`NetLoop`."""

    def __init__(
        self,
        netloop: NetLoop,
        host: str | None,
        port: int = DEFAULT_PORT,
        instance_name: str = "imqbroker",
        max_unauthenticated_per_address: int = DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS,
    ) -> None:
        self.netloop = netloop
        self.pending = AddressLimit("portmapper", max_unauthenticated_per_address)
        self.host = host
        self.instance_name = instance_name
        self._port = port
        self._entries: dict[str, ServiceEntry] = {}
        self._lock = threading.Lock()
        self._server: Listener | None = None

    @property
    def port(self) -> int:
        return self._port

    def register(self, entry: ServiceEntry) -> None:
        """Add or replace the line of service ``entry.name``."""
        with self._lock:
            self._entries[entry.name] = entry

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def entries(self) -> list[ServiceEntry]:
        with self._lock:
            own = ServiceEntry("portmapper", "tcp", "PORTMAPPER", self._port)
            return [own] + [e for n, e in self._entries.items() if n != "portmapper"]

    def table(self) -> bytes:
        return format_table(self.instance_name, self.entries())

    def start(self) -> PortMapper:
        async def start() -> Listener:
            return await listen(
                lambda admission: _Answer(self.table(), admission),
                self.host,
                self._port,
                name="port mapper",
                pending=self.pending,
            )

        self._server = self.netloop.run(start())
        self._port = self._server.port
        log.info("port mapper listening on %s:%d", self.host or "*", self._port)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return

        async def close() -> None:
            server.close()  # stop listening; answers in progress end on their own

        try:
            self.netloop.run(close(), timeout=5)
        except Exception:  # the loop may already be stopping; nothing left to release
            log.debug("port mapper: close failed", exc_info=True)
