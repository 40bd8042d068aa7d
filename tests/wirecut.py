"""A TCP proxy for the jms service's wire protocol (tests only) that cuts a connection at
one exact request: the moment the client's Nth request with a given op (XA_END, XA_PREPARE,
...) has fully arrived, the proxy either drops both sockets without forwarding it
(``forward=False``: the service never sees the request) or forwards it and drops both
sockets when the service's next bytes come (``forward=True``: the service did the work,
the client never hears about it), then calls ``then`` (e.g. to kill the service too).
Real sockets on 127.0.0.1; the frames are read with the protocol's own layout:
a 5-byte preamble, then ``u32 size | u8 kind | u32 channel | body``, a REQUEST's body
starting with its op byte.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

from bridgemgr.providers.embedded import wire

_HEAD = struct.Struct(">IBI")


class WireCutter:
    """Listens on 127.0.0.1 (``port``) and relays every connection to ``target_port``."""

    def __init__(
        self, target_port: int, op: wire.Op, nth: int = 1, forward: bool = False, then: Callable[[], None] | None = None
    ) -> None:
        self.target_port = target_port
        self.op = op
        self.left = nth  # requests with ``op`` still to let through, counting this one
        self.forward = forward
        self.then = then
        self.cut = threading.Event()  # set once the connection has been cut
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing = True
        self._server.close()
        for sock in list(self._sockets):
            _drop(sock)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                _drop(client)
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            armed = threading.Event()  # this connection's reply is the one to swallow
            threading.Thread(target=self._upstream, args=(client, server, armed), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, armed), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, armed: threading.Event) -> None:
        """Client -> service, frame by frame, watching for the request to cut at."""
        try:
            server.sendall(_read(client, len(wire.PREAMBLE)))
            while True:
                head = _read(client, _HEAD.size)
                size, kind, _channel = _HEAD.unpack(head)
                body = _read(client, size - 5)
                if kind == wire.Kind.REQUEST and body[:1] == bytes((self.op,)) and self._hit():
                    if not self.forward:
                        self._cut(client, server)
                        return
                    armed.set()
                server.sendall(head + body)
        except OSError:
            pass
        _drop(client)
        _drop(server)

    def _downstream(self, server: socket.socket, client: socket.socket, armed: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if armed.is_set():
                    self._cut(client, server)
                    return
                client.sendall(data)
        except OSError:
            pass
        _drop(client)
        _drop(server)

    def _hit(self) -> bool:
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return self.left == 0

    def _cut(self, client: socket.socket, server: socket.socket) -> None:
        _drop(client)
        _drop(server)
        if self.then is not None:
            self.then()
        self.cut.set()


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _drop(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
