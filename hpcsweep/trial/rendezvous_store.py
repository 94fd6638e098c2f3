"""The c10d store a multi-node trial's torchrun agents meet in, kept up until every agent has left it.

At the end of a run every agent closes the rendezvous (``DynamicRendezvousHandler.shutdown``: a
compare-and-set in the store). torch's own store host is node 0's agent, whose process ends as soon
as its own close is done: an agent still closing then loses the store mid-call, and a COMPLETED job's
log ends with a C++ ``recvBytes`` stack trace and "failed to shutdown the rendezvous ...
RendezvousConnectionError". So node 0's runner hosts the store itself, before its agent starts
(every agent, node 0's included, joins as a client), and after a successful run waits, with a
deadline, until each other node has said that its agent is done (a counter in the same store);
each other node says so once its agent has returned.

A single node's agent hosts its own store, as torch does: nobody closes after it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hpcsweep.trial.rendezvous import Rendezvous

log = logging.getLogger(__name__)

DONE_KEY = "hpcsweep/agents_done"
"""The store counter each node other than node 0 adds one to once its agent has closed the rendezvous."""
LAST_CLOSE_WAIT_S = 30.0
"""How long node 0 keeps the store up for the other nodes' closes after its own run succeeded."""
CONNECT_TIMEOUT_S = 10.0
"""How long another node tries to reach node 0's store to say that it is done."""


def all_done(count: Callable[[], int], others: int, deadline_s: float, clock: Callable[[], float] = time.monotonic,
             pause: Callable[[float], None] = time.sleep) -> bool:
    """Wait until ``count()`` reaches ``others`` or ``deadline_s`` passes; whether it did."""
    end = clock() + deadline_s
    while count() < others:
        if clock() >= end:
            return False
        pause(0.05)
    return True


def _tcp_store(rdzv: Rendezvous, is_master: bool, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(rdzv.master_addr, rdzv.master_port, is_master=is_master, wait_for_workers=False,
                    timeout=dt.timedelta(seconds=timeout_s), multi_tenant=is_master)


class AgentsStore:
    """This node's part in the store of a multi-node trial's agents (see the module's docstring)."""

    def __init__(self, rdzv: Rendezvous, timeout_s: float) -> None:
        self.rdzv = rdzv
        self.hosted = _tcp_store(rdzv, is_master=True, timeout_s=timeout_s) if rdzv.node_rank == 0 else None

    def finish(self, succeeded: bool) -> None:
        """Once this node's agent has returned: node 0 waits for the other nodes' closes (only after a success:
        a failed trial's nodes are ended by srun anyway); any other node says that it is done."""
        if self.hosted is not None:
            hosted = self.hosted
            if succeeded and not all_done(lambda: int(hosted.add(DONE_KEY, 0)), self.rdzv.nnodes - 1,
                                          LAST_CLOSE_WAIT_S):
                log.warning("not every node's agent said it was done within %.0f s: closing the rendezvous store",
                            LAST_CLOSE_WAIT_S)
            return
        try:
            _tcp_store(self.rdzv, is_master=False, timeout_s=CONNECT_TIMEOUT_S).add(DONE_KEY, 1)
        except RuntimeError as err:  # torch's DistError family: node 0 has gone, which is all it could say
            log.info("could not tell node 0 that this node's agent is done: %s", err)


@contextmanager
def agents_store(rdzv: Rendezvous, timeout_s: float) -> Iterator[Callable[[bool], None]]:
    """Around this node's agent: on node 0 of a multi-node trial, the store the agents meet in (``timeout_s``:
    its operations' timeout), closed when the block ends. Yields ``AgentsStore.finish``, to call in the
    block once the agent has returned; a single node's is a no-op."""
    if rdzv.nnodes == 1:
        yield lambda succeeded: None
        return
    store = AgentsStore(rdzv, timeout_s)
    try:
        yield store.finish
    finally:
        store.hosted = None  # the last reference: the store's server stops here
