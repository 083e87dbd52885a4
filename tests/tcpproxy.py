"""A loopback TCP proxy the test controls, standing in for the network between
an agent and its control plane:

- :meth:`TcpProxy.cut`: drop every connection (FIN) and refuse new ones until
  :meth:`TcpProxy.restore`;
- :meth:`TcpProxy.reset`: abort every connection with a TCP reset (RST), as a
  NAT or firewall that forgot them does, and keep accepting new ones;
- :meth:`TcpProxy.freeze`: keep connections open but deliver nothing (a dead
  route: packets lost, no reset) until :meth:`TcpProxy.restore`;
- :meth:`TcpProxy.sever`: reset every connection on the client's side only; the
  upstream's side stays open and hears nothing more (a laptop that changed
  networks: the agent knows at once, the control plane only by its silence);
- ``rate``: a slow link, in bytes per second per direction and connection;
- :meth:`TcpProxy.answer_503`: a reverse proxy whose upstream is down;
  :meth:`TcpProxy.answer_page`: one that answers every request with its own
  page (any status, any body, e.g. an HTML error page);
- ``target``: where new connections go, changed at will (a name that now
  leads to another server).

With ``upstream_wait`` a new connection whose upstream refuses it is held
open while the proxy keeps trying the upstream for that many seconds, as a
listening socket kept by the service manager (systemd socket activation)
holds clients while the server behind it restarts; without it such a
connection is closed at once.
"""
from __future__ import annotations

import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", upstream_wait: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.upstream_wait = upstream_wait
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._aborting: set[socket.socket] = set()  # closed with a reset, not a FIN (see reset)
        self._clients: set[socket.socket] = set()  # the client's side of each open connection
        self._kept: set[socket.socket] = set()  # upstream sides left open by sever, closed by close()
        self._closed = False
        self._answer: bytes | None = None  # the whole answer a proxy gives by itself, if any
        self.rate = 0.0  # bytes per second per direction and connection; 0 = unlimited
        self._flowing = threading.Event()
        self._flowing.set()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True, name="tcpproxy-accept").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()  # "network down": the connection is refused at once
                continue
            answer = self._answer
            if answer is not None:
                # A reverse proxy answering by itself (its upstream is down, or it has no route).
                try:
                    client.recv(65536)
                    client.sendall(answer)
                except OSError:
                    pass
                client.close()
                continue
            if self.upstream_wait:
                # Held clients must not hold up the next accept.
                threading.Thread(target=self._connect_when_up, args=(client,), daemon=True).start()
            else:
                self._connect(client)

    def _connect_when_up(self, client: socket.socket) -> None:
        deadline = time.monotonic() + self.upstream_wait
        while not self._closed and self._open.is_set():
            if self._connect(client, last_try=time.monotonic() > deadline):
                return
            time.sleep(0.05)  # the proxy's own retry interval while its upstream is down
        client.close()

    def _connect(self, client: socket.socket, last_try: bool = True) -> bool:
        """Pipe ``client`` to the upstream; False if the upstream refused and this was not the last try."""
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
        except OSError:
            if last_try:
                client.close()
            return last_try
        with self._lock:
            self._socks.update((client, upstream))
            self._clients.add(client)
            self.connections += 1
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
        return True

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(16384 if self.rate else 65536)
                if not data:
                    break
                while not self._flowing.wait(0.2):  # frozen: hold the bytes, as a dead route would
                    if self._closed:
                        return
                dst.sendall(data)
                if self.rate:  # a slow link
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with self._lock:
                    aborting = s in self._aborting
                    if s in self._kept:
                        continue  # severed: this side never learns the connection is gone
                if not aborting:  # a shutdown would send a FIN first; an abort sends only the RST
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                s.close()
            with self._lock:
                for s in (src, dst):
                    if s not in self._kept:
                        self._socks.discard(s)
                    self._aborting.discard(s)
                    self._clients.discard(s)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until :meth:`restore`."""
        self._open.clear()
        self._drop_all()

    def restore(self) -> None:
        self._answer = None
        self.rate = 0.0  # bytes per second per direction and connection; 0 = unlimited
        self._open.set()
        self._flowing.set()

    def reset(self) -> None:
        """Abort every open connection with a TCP reset on both sides; new connections go through."""
        with self._lock:
            socks = list(self._socks)
            self._aborting.update(socks)
        for s in socks:
            try:
                # Linger 0: close() discards what is unsent and answers with RST.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # Wakes the pipe thread blocked in recv() without sending anything; it then closes.
                s.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def sever(self) -> None:
        """Reset every open connection on the client's side only (new connections go through); the
        upstream's side stays open, silent, until :meth:`close`."""
        with self._lock:
            clients = list(self._clients)
            self._aborting.update(clients)
            self._kept.update(s for s in self._socks if s not in self._clients)
        for s in clients:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def answer_503(self) -> None:
        """Cut every connection; answer every new request with 503 until :meth:`restore`."""
        self.answer_page("503 Service Unavailable", b"")

    def answer_page(self, status: str, body: bytes, content_type: str = "text/html") -> None:
        """Cut every connection; answer every new request with ``status`` and ``body`` until :meth:`restore`."""
        self._answer = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                        f"Connection: close\r\n\r\n").encode() + body
        self._drop_all()

    def _drop_all(self) -> None:
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def freeze(self) -> None:
        """Keep every connection open but deliver nothing (packets lost, no reset)."""
        self._flowing.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        with self._lock:
            kept, self._kept = list(self._kept), set()
        for s in kept:
            s.close()
        self.listener.close()
