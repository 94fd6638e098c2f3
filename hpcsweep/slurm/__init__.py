"""Every Slurm command (``commands``) and every pure parser of Slurm text: environment, nodes, partitions,
topology tree, pending reasons and job states. Shared by the stages. May import only ``config``; never a stage or
a command module.
"""
