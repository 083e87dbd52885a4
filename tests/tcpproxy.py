"""A loopback TCP proxy the test controls: cut every connection, refuse new
ones for a while, then let them through again. It stands in for a network
cut between an agent and its control plane (CONN, DISC tests)."""
from __future__ import annotations

import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
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
        self._closed = False
        self._answer_503 = False
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
            if self._answer_503:
                # A reverse proxy whose upstream is down.
                try:
                    client.recv(65536)
                    client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                   b"Connection: close\r\n\r\n")
                except OSError:
                    pass
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.update((client, upstream))
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

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
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until :meth:`restore`."""
        self._open.clear()
        self._drop_all()

    def restore(self) -> None:
        self._answer_503 = False
        self.rate = 0.0  # bytes per second per direction and connection; 0 = unlimited
        self._open.set()
        self._flowing.set()

    def answer_503(self) -> None:
        """Cut every connection; answer every new request with 503 until :meth:`restore`."""
        self._answer_503 = True
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
        self.listener.close()
