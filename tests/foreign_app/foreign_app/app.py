"""The app's task function: a value derived from its config, also written into its working dir."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

RESULT_FILE = "result.txt"


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> str:
    """Return ``driver:port``; the file shows the task ran in the dir its JobReturn names."""
    value = f"{cfg.db.driver}:{cfg.server.port}"
    Path(RESULT_FILE).write_text(value + "\n")
    return value


if __name__ == "__main__":
    main()
