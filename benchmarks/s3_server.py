"""A real S3 endpoint for the tests and the benchmarks: moto's server on loopback, and a
guard that nothing else is contacted.

:class:`S3Server` runs moto's ``ThreadedMotoServer`` on ``127.0.0.1`` on a free
port (port 0: the kernel picks it, so parallel runs never collide) and hands out
the ``storage_options`` that reach it: fake credentials, its ``endpoint_url``, a
region and short botocore timeouts, all passed explicitly, so no process-wide
``AWS_*`` variable is needed and no real AWS endpoint is ever asked.

moto keeps its buckets in process-wide state: two servers in one process show the
same buckets, so every test uses a bucket of its own.

:func:`loopback_only` patches ``socket`` so that a connection or a name lookup for
anything but loopback fails and is recorded (the fixture asserts none happened):
the proof that botocore never reaches AWS or the EC2 metadata service.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

__all__ = ["S3Server", "free_port", "loopback_only", "serve"]

REGION = "eu-west-1"  # not us-east-1: s3fs sends it as LocationConstraint, which us-east-1 refuses

#: botocore settings that make a dead endpoint fail in about a second, not minutes.
FAIL_FAST = {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}


class S3Server:
    """moto's S3 on ``127.0.0.1``: ``start()``, ``storage_options()``, ``stop()``."""

    def __init__(self, latency: float = 0.0) -> None:
        from moto.server import ThreadedMotoServer

        #: seconds every request waits before it is answered (on its own thread: requests
        #: in flight at once wait at once), as an object store's round trip
        self.latency = latency

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.endpoint_url = ""
        self._faults: list[_Fault] = []

    def start(self) -> S3Server:
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        server: Any = self._moto._server  # werkzeug's ThreadedWSGIServer
        accept = server.process_request

        def process_request(request: socket.socket, address: Any) -> None:
            with self._lock:
                self._connections.add(request)
            accept(request, address)

        server.process_request = process_request
        server.app = self._faulty(server.app)
        return self

    def fail(
        self,
        match: str,
        times: int = 1,
        status: int = 503,
        code: str = "SlowDown",
        delay: float = 0,
    ) -> None:
        """Answer the next ``times`` GETs of a key containing ``match`` with an S3 error.

        ``status`` and ``code`` are the HTTP status and S3 error code of the answer
        (503 ``SlowDown``: throttling; 500 ``InternalError``; 403 ``AccessDenied``);
        with ``delay`` (seconds) the server waits that long before answering, for
        client timeouts.  The faults are real HTTP answers, so every client (s3fs,
        obstore) sees them as it would from AWS.
        """
        with self._lock:
            self._faults.append(_Fault(match, times, status, code, delay))

    def _faulty(self, app: Any) -> Any:
        def faulty(environ: dict[str, Any], start_response: Any) -> Any:
            if self.latency:
                time.sleep(self.latency)
            fault = self._take_fault(environ)
            if fault is None:
                return app(environ, start_response)
            if fault.delay:
                time.sleep(fault.delay)
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{fault.code}</Code><Message>injected fault</Message></Error>"
            ).encode()
            reason = HTTPStatus(fault.status).phrase
            start_response(
                f"{fault.status} {reason}",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [body]

        return faulty

    def _take_fault(self, environ: dict[str, Any]) -> _Fault | None:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return None
        path = environ.get("PATH_INFO", "")
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and fault.match in path:
                    fault.times -= 1
                    return fault
        return None

    def storage_options(self, **overrides: Any) -> dict[str, Any]:
        """``storage_options`` for s3fs that reach this server and nothing else."""
        options: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
            "config_kwargs": FAIL_FAST,
        }
        options.update(overrides)
        return options

    def new_bucket(self, prefix: str = "dzb") -> str:
        """Create a bucket with a fresh name and return its name."""
        import s3fs

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**self.storage_options()).mkdir(name)
        return name

    def stop(self) -> None:
        """Stop accepting connections, then drop the ones open (keep-alive) at once.

        werkzeug's ``shutdown`` only closes the listening socket: a connection a
        client keeps alive would still be served. Shutting those down too makes
        this a server that died, as a crashed or unplugged one does.
        """
        self._moto.stop()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


def serve(latency: float) -> None:
    """``python -m benchmarks.s3_server [--latency S]``: a server in a process of its own.

    Prints one JSON line (``endpoint_url``, ``bucket``: a new bucket, ``storage_options``)
    and serves until its standard input closes.  A benchmark runs the server apart so that
    moto's Python answering requests does not compete for the GIL of the readers measured.
    """
    import json
    import sys

    server = S3Server().start()
    try:
        bucket = server.new_bucket("peers")
        server.latency = latency  # from here on: creating the bucket waited for nothing
        options = server.storage_options()
        print(json.dumps({"endpoint_url": server.endpoint_url, "bucket": bucket,
                          "storage_options": options}), flush=True)  # fmt: skip
        sys.stdin.read()
    finally:
        server.stop()


@dataclass
class _Fault:
    match: str
    times: int
    status: int
    code: str
    delay: float


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _is_loopback(host: Any) -> bool:
    if host is None or host == "localhost":
        return True
    if isinstance(host, bytes):
        host = host.decode()
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
        return address.is_loopback or address.is_unspecified  # 0.0.0.0: bind to this host
    except ValueError:
        return False


@contextlib.contextmanager
def loopback_only() -> Iterator[list[str]]:
    """Refuse and record every connection or name lookup that is not loopback."""
    attempts: list[str] = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex
    getaddrinfo = socket.getaddrinfo

    def check(sock: socket.socket, address: Any) -> None:
        # Connecting a UDP socket sends nothing (distributed does it to 8.8.8.8 to
        # learn which local address routes outwards); TCP is what would talk.
        if sock.type == socket.SOCK_DGRAM:
            return
        if isinstance(address, tuple) and not _is_loopback(address[0]):
            attempts.append(f"connect {address!r}")
            raise ConnectionRefusedError(f"test guard: {address!r} is not loopback")

    def guarded_connect(self: socket.socket, address: Any) -> None:
        check(self, address)
        return connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        check(self, address)
        return connect_ex(self, address)

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback(host):
            attempts.append(f"getaddrinfo {host!r}")
            raise socket.gaierror(socket.EAI_NONAME, f"test guard: {host!r} is not loopback")
        return getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = guarded_getaddrinfo
    try:
        yield attempts
    finally:
        socket.socket.connect = connect  # type: ignore[method-assign]
        socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = getaddrinfo


if __name__ == "__main__":
    import argparse

    command = argparse.ArgumentParser(prog="python -m benchmarks.s3_server")
    command.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    serve(command.parse_args().latency)
