"""One trial on one node: rendezvous, NCCL environment, stop signals and requeue, then the workers.

May import only the shared packages, ``train`` and ``results``; never ``sweep`` or a command module.
"""
