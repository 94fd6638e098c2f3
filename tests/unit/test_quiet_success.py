"""Quiet success: node 0 keeps the rendezvous store up until every node's agent has closed it, and torch's C++
warnings come from rank 0 only (issue 31, item 10)."""

from __future__ import annotations

import logging
import socket
import threading

from hpcsweep.train.observe.rank_logging import cpp_log_level
from hpcsweep.trial import rendezvous_store
from hpcsweep.trial.rendezvous import Rendezvous
from hpcsweep.trial.rendezvous_store import DONE_KEY, agents_store, all_done


def test_cpp_warnings_are_left_to_rank_0_unless_the_user_set_a_level():
    assert cpp_log_level({"RANK": "0"}) is None
    assert cpp_log_level({}) is None  # not under torchrun: one process
    assert cpp_log_level({"RANK": "3"}) == "ERROR"
    assert cpp_log_level({"RANK": "3", "TORCH_CPP_LOG_LEVEL": "INFO"}) is None


def test_waiting_for_the_other_nodes_ends_when_they_are_done_or_at_the_deadline():
    counts = iter([0, 1, 1, 2])
    now = [0.0]
    assert all_done(lambda: next(counts), 2, 10.0, clock=lambda: now[0], pause=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] < 1.0
    assert not all_done(lambda: 0, 1, 1.0, clock=lambda: now[0], pause=lambda s: now.__setitem__(0, now[0] + s))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_node_0_hosts_the_store_and_waits_for_the_other_nodes_to_be_done(monkeypatch, caplog):
    port = free_port()
    head, other = (Rendezvous("127.0.0.1", port, 2, rank, 1, "7") for rank in (0, 1))
    with agents_store(head, timeout_s=30) as finish_head:
        from torch.distributed import TCPStore

        # An agent joins the hosted store as a client, as torch's c10d backend does with is_host=False.
        client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        client.set("torch.rendezvous.7", "state")
        with agents_store(other, timeout_s=30) as finish_other:
            done = threading.Thread(target=finish_other, args=(True,))
            done.start()
            finish_head(True)  # returns once node 1 has said it is done
            done.join()
        assert int(client.add(DONE_KEY, 0)) == 1
    monkeypatch.setattr(rendezvous_store, "LAST_CLOSE_WAIT_S", 0.2)
    with caplog.at_level(logging.WARNING, logger="hpcsweep.trial.rendezvous_store"):
        with agents_store(Rendezvous("127.0.0.1", free_port(), 2, 0, 1, "8"), timeout_s=30) as finish_alone:
            finish_alone(True)  # nobody else says anything: the deadline ends the wait
    assert "not every node's agent said it was done within 0 s" in caplog.text
    with agents_store(Rendezvous("127.0.0.1", free_port(), 1, 0, 2, "9"), timeout_s=30) as single:
        single(True)  # one node: its agent hosts its own store, nothing to wait for
