"""`python -m qualify.workloads.train.torchrun ARGS`: torchrun whose rendezvous listens on the
master address only.

torchrun's static rendezvous (``--nnodes N --node-rank k --master-addr A --master-port P``)
starts its TCPStore on the agent of node 0, and c10d binds that store to the wildcard address
(every interface; seen with torch 2.13: ``*:P`` in ``ss -ltn``). Qualify's rule is that what it
starts listens where it was asked to (127.0.0.1 for a cluster on one machine). So this wrapper
binds the listening socket to A itself and hands it to the store (TCPStore's
``master_listen_fd``); everything else is torchrun unchanged (its agent, its restarts, its
worker environment). Workers reach the store as clients (torchrun's agent store), so they open
no store of their own. Standard library and the image's torch only.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

LISTEN_BACKLOG = 2048  # c10d's own default backlog for the store's listener


def bound_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port only (SO_REUSEADDR, as c10d sets it)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _bound_tcp_store(store_cls: Any):
    """A TCPStore factory whose master listens on its host_name only."""
    def make(host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
             *args: Any, **kwargs: Any) -> Any:
        if is_master and kwargs.get("master_listen_fd") is None:
            # detach(): the store owns the descriptor from here on (closing it here would end it).
            kwargs["master_listen_fd"] = bound_listener(host_name, port).detach()
        return store_cls(host_name, port, world_size, is_master, *args, **kwargs)
    return make


def patch_static_rendezvous() -> bool:
    """Make torchrun's static rendezvous bind its store to the master address; False when this
    torch's static rendezvous is not shaped as expected (then it stays as torch made it)."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    store_cls = getattr(static, "TCPStore", None)
    if store_cls is None:
        return False
    static.TCPStore = _bound_tcp_store(store_cls)
    return True


def main(argv: list[str]) -> None:
    if not patch_static_rendezvous():
        print("qualify torchrun: this torch's static rendezvous is unknown; its store may listen on "
              "every interface", file=sys.stderr)
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
