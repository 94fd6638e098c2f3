"""``python -m hpcsweep [overrides]`` runs one trial; ``-m`` runs a sweep."""

import sys

from hpcsweep.control.exit_codes import EXIT_INTERRUPTED, EXIT_REFUSED


def main() -> None:
    """Console-script entry point, the same as ``python -m hpcsweep``.

    A misspelt key, or a single run's bad config, is refused before Hydra starts (exit 2); a
    stopped trial or sweep ends with one line saying how to resume it, never a traceback
    (``hpcsweep.control.exit_codes``, which ``hpcsweep.app`` and the launchers end the command
    through, has the table of exit codes).
    """
    from hpcsweep.sweep.override_keys import check_override_keys
    from hydra_plugins.hpcsweep_plugins.config import launcher_keys

    try:
        check_override_keys(sys.argv[1:], launcher_keys())
    except ValueError as err:
        print(err, file=sys.stderr)
        raise SystemExit(EXIT_REFUSED) from None

    from hpcsweep.app import hydra_main
    from hpcsweep.sweep.hooks import hook_of
    from hpcsweep.sweep.single_run import check_single_run

    try:
        checked = check_single_run(sys.argv[1:])
    except ValueError as err:
        print(f"{err}; the trial did not run", file=sys.stderr)
        raise SystemExit(EXIT_REFUSED) from None

    try:
        # A single run's trial is validated once, above: the task function runs that config.
        with hook_of(hydra_main).running_checked(checked):
            hydra_main()
    except KeyboardInterrupt:
        print("interrupted before any trial started training", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
