"""One trial on one node: rendezvous, NCCL environment, stop signals and requeue, then the workers.

May import ``hpcsweep.config``, ``hpcsweep.files``, ``hpcsweep.slurm`` and ``hpcsweep.train``; never ``sweep``,
``results`` or a command module.
"""
