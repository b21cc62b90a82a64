"""Keeping a run on this machine: what listens, and where.

Neither a ``TCPStore`` (the rendezvous store) nor Gloo authenticates its peers, and object
collectives (``gather_object``) unpickle what they receive, so anything a run listens on must be
unreachable from the network. In torch 2.13 a ``TCPStore`` that creates its own socket listens on
every interface, whatever host it is given; ``loopback_store`` binds the socket to 127.0.0.1 itself
and hands it over (``master_listen_fd``). Gloo listens on the interface ``GLOO_SOCKET_IFNAME``
names: the loopback one here. ``listening_addresses`` reads what a set of processes listens on,
for the tests that check it.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def loopback_interface() -> str:
    """Name of the loopback network interface ('lo' on Linux, 'lo0' on macOS) for Gloo."""
    for _, name in socket.if_nameindex():
        if name in ("lo", "lo0"):
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


def gloo_interface_notice() -> str | None:
    """A one-line notice if the reader's ``GLOO_SOCKET_IFNAME`` takes Gloo off loopback
    (the launchers only ever set it to loopback), else None."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    if not name or name == loopback_interface():
        return None
    return (
        f"notice: GLOO_SOCKET_IFNAME={name} is set, so the workers' Gloo sockets listen on "
        f"{name}, not only on loopback; unset it to keep them on {loopback_interface()}"
    )


def loopback_store(
    world_size: int | None, timeout: float, port: int = 0, multi_tenant: bool = False
) -> dist.TCPStore:
    """A ``TCPStore`` server listening on 127.0.0.1 only (on ``port``, or a free one the OS
    picks). ``TCPStore(LOOPBACK, 0, is_master=True)`` would listen on every interface: bind the
    socket here and hand it over instead."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # as TCPStore's own listening socket does: a port torchrun picked for the workers' store
        # may still hold a closed connection (TIME_WAIT), which would refuse a plain bind
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen()
        store = dist.TCPStore(
            LOOPBACK,
            sock.getsockname()[1],
            world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout),
            multi_tenant=multi_tenant,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it
    return store


def socket_inodes(pids: list[int]) -> set[str]:
    """The inodes of the sockets the processes ``pids`` hold (Linux's ``/proc``); a process that
    has exited meanwhile holds none."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # it has exited
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def tcp_sockets(net_of: int | str = "self") -> list[tuple[str, str, str, str]]:
    """Every TCP socket of a network namespace as (state, local address, remote address, inode),
    from ``/proc/PID/net/tcp`` and ``tcp6`` of the process ``net_of`` (default: this process's
    namespace); state "0A" is LISTEN, "01" ESTABLISHED."""
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{net_of}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = (_address(a, family) for a in fields[1:3])
            found.append((fields[3], local, remote, fields[9]))
    return found


def listening_addresses(pids: list[int], net_of: int | str = "self") -> list[str]:
    """The local addresses (``ip:port``, IPv6 in brackets) the processes ``pids`` listen on for
    TCP (Linux only), read in the network namespace of process ``net_of`` (default: this one's)."""
    inodes = socket_inodes(pids)
    sockets = tcp_sockets(net_of)
    return [local for state, local, _, inode in sockets if state == "0A" and inode in inodes]


def on_loopback(address: str) -> bool:
    """Whether a ``listening_addresses`` entry is reachable from this machine only."""
    return address.startswith(("127.", "[::1]:", "[::ffff:127."))


def _address(hex_address: str, family: int) -> str:
    """/proc/net/tcp's "0100007F:1F90" as "127.0.0.1:8080" (IPv6 in brackets)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
    host = socket.inet_ntop(family, raw)
    return f"{host if family == socket.AF_INET else f'[{host}]'}:{int(port, 16)}"
