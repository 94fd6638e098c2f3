#!/usr/bin/env bash
# The one test command: installs what a fresh machine lacks (`slurm-cluster up` installs the
# Debian packages as root), starts the local Slurm cluster,
# runs the unit and cluster tests, always stops the cluster, and exits with pytest's status.
#   scripts/test.sh [pytest args]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python=${PYTHON:-python3}

# A CPU build of torch when none is importable: plain `pip install torch` may pull a multi-GB CUDA build.
if ! "$python" -c "import torch" >/dev/null 2>&1; then
    "$python" -m pip install --quiet "torch==2.13.0"
fi
"$python" -m pip install --quiet -e ".[test]"

cleanup() { "$repo/scripts/slurm-cluster" down || true; }
trap cleanup EXIT
"$repo/scripts/slurm-cluster" up
eval "$("$repo/scripts/slurm-cluster" env)"

set +e
"$python" -m pytest -q -p no:cacheprovider tests/unit tests/cluster "$@"
status=$?
set -e
exit "$status"
