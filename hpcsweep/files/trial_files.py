"""The names of the files a trial directory holds, one place for every stage that writes or reads them."""

CONFIG_FILE = "config.yaml"
"""The resolved trial config the workers read."""
METRICS_FILE = "metrics.json"
"""The trial's state, rewritten atomically as it runs (``hpcsweep.files.metrics_file``)."""
ENVIRONMENT_FILE = "environment.json"
"""What the trial ran under: code version, rendezvous, NCCL variables, Slurm job, code snapshot."""
TRIAL_FILES = (METRICS_FILE, CONFIG_FILE, ENVIRONMENT_FILE)
"""Files a trial dir holds once it has started: without sweep.json, they make it a sweep of one."""
