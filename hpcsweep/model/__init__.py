"""What a trial trains from, known on the login node without torch: the pretrained folder
(``folder``), the variables that keep every process off the hub (``offline``), and the facts of each
architecture that both the trainer and the memory plan read.

Imports nothing of hpcsweep outside this package; never a stage or a command module. Every stage
may read it.
"""
