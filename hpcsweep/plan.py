"""``python -m hpcsweep.plan [-m] OVERRIDES``: the memory plan of each trial the same sweep command
would run, part by part (weights, gradients, optimizer, activations, loss, temporaries, overhead),
against the GPUs it would get; nothing is run or submitted (``docs/user/memory-plan.md``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hpcsweep.model.offline import stay_offline


def main(argv: Sequence[str] | None = None) -> int:
    """Print the plans; exit 2 with one line when a trial's config is refused."""
    stay_offline()
    import hydra_plugins.hpcsweep_plugins.config  # noqa: F401  (stores the launchers' configs)
    from hpcsweep.sweep.plan_preview import plan_preview

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        lines = plan_preview(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
