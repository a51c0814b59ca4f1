"""A loopback TCP proxy its owner controls, to put PostgreSQL or Redis through
an outage without touching the real server. Shared by the outage tests
(tests/support/outage_harness.py, tests/processes/test_readyz.py, tests/processes/test_limits.py) and the
soak (bench/soak.py).

    proxy = TcpProxy("127.0.0.1", 5432).start()    # forwards 127.0.0.1:proxy.port
    proxy.refuse()    # new connections refused, open ones cut (a server that went down)
    proxy.silence()   # everything accepted and read, nothing answered, nothing closed
                      # (a host that stopped answering, or a network that drops packets)
    proxy.restore()   # forwarding again; connections that went silent are cut, as a
                      # host coming back resets the connections it no longer knows
    proxy.cut()       # cut every open connection (RST), whatever the mode
    proxy.stop()

Runs in threads of its owner's process: one accepting, two per connection.
"""

from __future__ import annotations

import socket
import struct
import threading

PASS, REFUSE, SILENT = "pass", "refuse", "silent"


def _reset(sock: socket.socket) -> None:
    """Close with RST, waking any thread blocked on the socket."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _close_listener(listener: socket.socket) -> None:
    """Stop listening now: a bare close() leaves the socket listening while
    the accepting thread is still blocked in accept()."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


class _Link:
    """One client connection and, unless it was born silent, its upstream."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket | None) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.silent = upstream is None  # swallow everything, answer nothing
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._pump, args=(self.client, "up"), daemon=True).start()
        if self.upstream is not None:
            threading.Thread(target=self._pump, args=(self.upstream, "down"), daemon=True).start()

    def _pump(self, source: socket.socket, direction: str) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.silent:
                    continue  # read, never answered
                target = self.upstream if direction == "up" else self.client
                assert target is not None
                target.sendall(data)
        except OSError:
            pass
        if self.silent and direction == "down":
            # The server let go of a connection gone silent: the client is
            # told nothing, as a silent host tells nothing.
            _reset(source)
            return
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.upstream):
            if sock is not None:
                _reset(sock)
        self.proxy._forget(self)


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.mode = PASS
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopped = False

    # -- control -------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._listen()
        return self

    def refuse(self, cut: bool = True) -> None:
        """New connections are refused (nothing listens on the port); open
        ones are cut unless ``cut`` is False."""
        with self._lock:
            self.mode = REFUSE
            listener, self._listener = self._listener, None
        if listener is not None:
            _close_listener(listener)
        if cut:
            self.cut()

    def silence(self) -> None:
        """Nothing is answered any more, on open connections or new ones;
        nothing is closed either."""
        with self._lock:
            self.mode = SILENT
            for link in self._links:
                link.silent = True
        if self._listener is None:
            self._listen()

    def restore(self) -> None:
        with self._lock:
            self.mode = PASS
            stale = [link for link in self._links if link.silent]
        for link in stale:
            link.close()
        if self._listener is None:
            self._listen()

    def cut(self) -> None:
        """Reset every open connection."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def stop(self) -> None:
        self._stopped = True
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            _close_listener(listener)
        self.cut()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- machinery -----------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(512)
        self.port = listener.getsockname()[1]  # the same port again after a refusal
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refusing, or stopped
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = None
            if self.mode == PASS:
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    _reset(client)
                    continue
            link = _Link(self, client, upstream)
            with self._lock:
                if self.mode != PASS:
                    link.silent = True
                self._links.add(link)
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
