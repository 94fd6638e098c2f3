"""``python -m hpcsweep [overrides]`` runs one trial; ``-m`` runs a sweep."""

from hpcsweep.app import hydra_main


def main() -> None:
    """Console-script entry point, the same as ``python -m hpcsweep``."""
    hydra_main()


if __name__ == "__main__":
    main()
