"""How workers hand their results to the caller: one pipe per worker, each message a kind byte, a
length and that many bytes. The caller reads without blocking, so a worker that dies half-way
through sending (killed while it writes a 200 MB result) cannot hang it: the pipe's end of file
says the worker has gone, and the bytes that did arrive say how far it got.

A ``multiprocessing.Queue`` shared by all workers cannot promise that: its reader, once a
message has begun, blocks until the rest arrives, and a dead writer never sends it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

OK, ERROR = b"o", b"e"
_HEADER = struct.Struct("!cQ")  # kind, length in bytes
_READ = 1 << 20


def send(channel: Connection, kind: bytes, data: bytes) -> None:
    """Write one message to ``channel`` (the worker's end of its pipe), blocking until the
    caller has room for it."""
    fd = channel.fileno()
    for part in (_HEADER.pack(kind, len(data)), data):
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


@dataclass
class _Pipe:
    conn: Connection
    buffer: bytearray = field(default_factory=bytearray)
    ended: bool = False  # end of file: every writer of the pipe has closed it (or died)


class Inbox:
    """The caller's ends of the workers' pipes, read as the messages arrive."""

    def __init__(self, readers: list[Connection]):
        self.pipes = [_Pipe(conn) for conn in readers]
        for conn in readers:
            os.set_blocking(conn.fileno(), False)

    def poll(self, timeout: float) -> list[tuple[bytes, int, bytes]]:
        """Wait up to ``timeout`` seconds for data, read whatever has arrived, and return the
        messages now complete, as (kind, rank, data)."""
        open_ = {p.conn: rank for rank, p in enumerate(self.pipes) if not p.ended}
        messages = []
        for conn in wait(list(open_), timeout) if open_ else []:
            rank = open_[conn]  # type: ignore[index]
            self._drain(self.pipes[rank])
            messages += [(kind, rank, data) for kind, data in self._complete(self.pipes[rank])]
        return messages

    def _drain(self, pipe: _Pipe) -> None:
        while True:
            try:
                chunk = os.read(pipe.conn.fileno(), _READ)
            except BlockingIOError:
                return
            if not chunk:
                pipe.ended = True
                return
            pipe.buffer += chunk

    @staticmethod
    def _complete(pipe: _Pipe) -> list[tuple[bytes, bytes]]:
        found = []
        while len(pipe.buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(pipe.buffer)
            end = _HEADER.size + length
            if len(pipe.buffer) < end:
                break
            found.append((kind, bytes(pipe.buffer[_HEADER.size : end])))
            del pipe.buffer[:end]
        return found

    def gone(self, rank: int, alive: bool) -> bool:
        """Whether worker ``rank`` can send nothing more: its pipe has ended, or its process is
        dead (``alive`` False) and nothing is left to read (a child it started could still
        hold the pipe open, and the end of file never come)."""
        pipe = self.pipes[rank]
        return pipe.ended or (not alive and not wait([pipe.conn], 0))

    def partial(self, rank: int) -> str:
        """How much of an unfinished message from ``rank`` arrived ("" if none began)."""
        buffer = self.pipes[rank].buffer
        if not buffer:
            return ""
        if len(buffer) < _HEADER.size:
            return f"{len(buffer)} bytes of a message"
        _, length = _HEADER.unpack_from(buffer)
        return f"{len(buffer) - _HEADER.size:,} of its {length:,} bytes"

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.conn.close()
