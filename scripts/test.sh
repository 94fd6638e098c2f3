#!/usr/bin/env bash
# The one test command. It installs what a fresh machine lacks, runs the tests, and exits with
# pytest's status.
#   scripts/test.sh [pytest args]          every test, unit and cluster (what CI runs: .ci/run): starts
#                                          the local Slurm cluster (`slurm-cluster up` installs the Debian
#                                          packages as root) and always stops it
#   scripts/test.sh --fast [pytest args]   the unit tests not marked slow, in a few minutes; installs and
#                                          starts no Slurm
# pytest args come after the tests to run, e.g. `scripts/test.sh --fast -k budget` or `scripts/test.sh -x`.
# Markers (setup.cfg): `cluster` marks every test under tests/cluster, `slow` the unit tests that take
# more than about 5 s (listed in tests/conftest.py); `-m "not slow"` or `-m slow` selects by them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python=${PYTHON:-python3}

fast=false
pytest_args=()
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then fast=true; else pytest_args+=("$arg"); fi
done

# A CPU build of torch when none is importable: plain `pip install torch` may pull a multi-GB CUDA build.
if ! "$python" -c "import torch" >/dev/null 2>&1; then
    "$python" -m pip install --quiet "torch==2.13.0"
fi
"$python" -m pip install --quiet -e ".[test]"

if "$fast"; then
    exec "$python" -m pytest -q -p no:cacheprovider tests/unit -m "not slow" "${pytest_args[@]}"
fi

image_pid=
cleanup() {
    [ -z "$image_pid" ] || kill "$image_pid" 2>/dev/null || true
    "$repo/scripts/slurm-cluster" down || true
}
trap cleanup EXIT
# The shape the cluster tests are written for, whatever an earlier `up` in this folder recorded; with
# Slurm's OCI support (runc), which only a job asking for a container reads.
"$repo/scripts/slurm-cluster" up --nodes 4 --leaf-switches 2 --port-offset 0 --max-array-size 1001 --oci
eval "$("$repo/scripts/slurm-cluster" env)"

# The container tests' OCI bundle, built (or found cached) in the background while the tests before them
# run. tests/cluster/test_container_oci.py waits for "$HPCSWEEP_TEST_IMAGE_LOG.rc" (the build's exit
# status) and names the log when it is not 0. After `up`, whose apt-get it must not run beside.
export HPCSWEEP_TEST_IMAGE=${HPCSWEEP_TEST_IMAGE:-/var/tmp/hpcsweep-test-image}
export HPCSWEEP_TEST_IMAGE_LOG="$HPCSWEEP_TEST_IMAGE.log"
rm -f "$HPCSWEEP_TEST_IMAGE_LOG.rc"
cluster_dir=$(dirname "$(dirname "$SLURM_CONF")")
( set +e; "$python" "$repo/scripts/make-test-image" "$HPCSWEEP_TEST_IMAGE" --bind "$cluster_dir" \
      >"$HPCSWEEP_TEST_IMAGE_LOG" 2>&1
  echo $? >"$HPCSWEEP_TEST_IMAGE_LOG.rc" ) &
image_pid=$!

set +e
"$python" -m pytest -q -p no:cacheprovider --durations=40 tests/unit tests/cluster "${pytest_args[@]}"
status=$?
set -e
exit "$status"
