#!/usr/bin/env bash
# The timing-sensitive tests (pytest marker `timing`: load generator, scripted server, server protocol,
# compare end to end) once more, with CPU-burning processes beside them. A behaviour test must not depend on
# the machine's speed; a quiet CI machine hides one that does, a shared one makes it flake. .ci/run calls this
# after the main test command, inside its virtual environment. About 4 minutes on a quiet 2-core machine.
#   usage: .ci/under_load.sh [PYTEST ARGS...]   (UNDER_LOAD_BURNERS: how many burners, default 2)
# The burners are stopped however this ends: pytest's exit, a failure, Ctrl-C or SIGTERM (passed on to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
burners=${UNDER_LOAD_BURNERS:-2}
pids=()
test_pid=
stop() {
  local pid
  [ -z "$test_pid" ] || kill -TERM "$test_pid" 2>/dev/null || true
  for pid in ${pids[@]+"${pids[@]}"}; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  pids=()
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$burners"); do
  bash -c 'while :; do :; done' &  # a process of its own: none of this script's traps
  pids+=($!)
done
echo "+ python -m pytest -m timing $*   (beside $burners CPU burners)"
# In the background, so that a signal reaches the traps at once instead of after pytest ends; with job
# control on, as a background job of a script would otherwise start with SIGINT ignored, and so would every
# process the tests start (the tests that stop a run with Ctrl-C would see it ignored).
set -m
python -m pytest -m timing "$@" &
test_pid=$!
status=0
wait "$test_pid" || status=$?
test_pid=
exit "$status"
