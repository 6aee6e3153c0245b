"""The rendezvous store, served on one address only.

`serve_store(host, port, world_size, timeout, wait_for_workers)` -> a master `TCPStore` whose
listening socket is bound to `host` alone (torch's own master listens on every interface,
`*:PORT`, whatever host it is given): 127.0.0.1 for ranks on one host (`launch`), the address
the user names for rank 0 of a multi-node job (`joined`: MASTER_ADDR). `port` 0 picks a free
port (the store's `.port`). The socket is made here, listening, and handed to the store
(`master_listen_fd`); the store owns it from then on. Clients connect as usual
(`TCPStore(host, port, ..., is_master=False)`). Raises OSError where the address cannot be
bound (not this host's, or the port is taken).
"""

from __future__ import annotations

import datetime
import socket
from typing import Optional

import torch.distributed as dist

BACKLOG = 1024  # pending connections (every rank connects at once)


def serve_store(
    host: str,
    port: int,
    world_size: Optional[int],
    timeout: datetime.timedelta,
    wait_for_workers: bool = False,
) -> dist.TCPStore:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        bound = sock.getsockname()[1]
        store = dist.TCPStore(
            host,
            bound,
            world_size,
            True,
            timeout=timeout,
            wait_for_workers=wait_for_workers,
            master_listen_fd=sock.detach(),
        )
    finally:
        sock.close()  # detached on success: closes nothing then
    return store
