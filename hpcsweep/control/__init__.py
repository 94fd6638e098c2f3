"""How a stage stops and how a trial ends, shared by every stage: the stop protocol (signals, the stop request,
the stop file), the ``Outcome`` a trial's phases return, and the one mapping of outcomes to exit codes and requeues.

May import only ``files`` and ``slurm``; never a stage or a command module.
"""
