"""The app's task function: a value derived from its config, also written into its working dir."""

import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

RESULT_FILE = "result.txt"
# One line per start of the task function in this working dir.
STARTS_FILE = "starts.txt"


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> str:
    """Return ``driver:port``; the file shows the task ran in the dir its JobReturn names.

    With ``work_s`` set, the first start works that long before returning (a job that outlives
    its time limit); a later start in the same dir finds its marker and returns at once.
    """
    starts = Path(STARTS_FILE)
    first_start = not starts.exists()
    with starts.open("a") as handle:
        handle.write("start\n")
    if first_start and cfg.work_s:
        time.sleep(cfg.work_s)
    value = f"{cfg.db.driver}:{cfg.server.port}"
    Path(RESULT_FILE).write_text(value + "\n")
    return value


if __name__ == "__main__":
    main()
