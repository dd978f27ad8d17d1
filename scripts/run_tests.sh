#!/usr/bin/env bash
# `make test`: the whole suite as pytest runs in two lanes side by side, never more than two pytests
# at once (a third beside them overloaded 2 cores: every `hitl up` start is ~43 s of CPU):
#   lane 1   the browser tests (their shared `hitl up`s of tests/browser_stack.py intact: those groups
#            span modules, so they stay in one pytest) and the Ray modules not named in RAY_SPLIT;
#   lane 2   every test without the markers ray, ray_cluster or browser ("others": Redis and Lua,
#            CPU-bound), then the Ray modules in RAY_SPLIT, once the others are done, then the short
#            load test (`make loadtest-short`: locust on a fresh `hitl up`, the invariant checker; any
#            breach or 5xx fails it), which used to run after both lanes in CI.
# Lane 1 prints as it goes; lane 2 logs to files printed at the end. With arguments (-k, -x, a file,
# --lf) lane 2 runs the others alone and lane 1 every Ray and browser test, as a module list of
# RAY_SPLIT would otherwise run twice, and no load test. The exit status is the worst of them.
#   usage: scripts/run_tests.sh [PYTEST_ARGS...]      (PY: the interpreter, default .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Bytecode caches (__pycache__, gitignored), written once and read by every later process of the run:
# an image that sets PYTHONDONTWRITEBYTECODE (this sandbox's does) made every Python process compile
# this checkout's modules again (each Ray worker of each `hitl up`, the page server, each CLI call) and
# every pytest rewrite the asserts of all its ~440 modules (a collection 40 -> 22 s of CPU with them).
unset PYTHONDONTWRITEBYTECODE
"$PY" -m compileall -q -j 0 statecore serve_app deployments archive ui client harness tests benchmarks loadtest >/dev/null
STACK="ray or ray_cluster or browser"
# Chosen from the per-test times of a full run (HITL_JUNIT_DIR below) so the lanes end close together
# (stop 43's run: lane 1 2,142 s of tests, lane 2 1,014 + 902 + the load test's ~60 s before
# test_store_recovery_serve moved here): the others take ~17 min beside lane 1, these ~11 min of Ray
# tests after them; lane 1 holds the browser tests (~13 min) and the other Ray modules (~22 min).
RAY_SPLIT=(
  tests/test_autoscale.py tests/test_restart_same_port.py tests/test_e2e_serve.py tests/test_benchmarks_smoke.py
  tests/test_e2e_sam.py tests/test_ray_cluster.py tests/test_store_recovery_serve.py
)
# HITL_JUNIT_DIR: each run also writes its JUnit XML there (stack.xml, rest.xml, ray.xml): the per-test
# times scripts/slow_tests.py reads (rest.xml) to keep `make test-fast` quick.
junit() { [ -n "${HITL_JUNIT_DIR:-}" ] && echo "--junitxml=$HITL_JUNIT_DIR/$1.xml"; }
[ -n "${HITL_JUNIT_DIR:-}" ] && mkdir -p "$HITL_JUNIT_DIR"
common=(-q -p no:cacheprovider --durations=20)

lane2() {  # the others, then (no arguments) the Ray modules of RAY_SPLIT; a log and an exit status each
  "$PY" -m pytest "${common[@]}" $(junit rest) -m "not ($STACK)" "$@" >"$log_others" 2>&1
  echo "$?" >"$log_others.rc"
  if [ $# -eq 0 ]; then
    "$PY" -m pytest "${common[@]}" $(junit ray) -m "$STACK" "${RAY_SPLIT[@]}" >"$log_ray" 2>&1
    echo "$?" >"$log_ray.rc"
    "$PY" -m loadtest.run $LOAD_ARGS >"$log_load" 2>&1
    echo "$?" >"$log_load.rc"
  fi
}
log_others=$(mktemp -t hitl-tests-others.XXXXXX.log)
log_ray=$(mktemp -t hitl-tests-ray.XXXXXX.log)
log_load=$(mktemp -t hitl-tests-load.XXXXXX.log)
LOAD_ARGS="--seconds 20 --users 10 --no-bench"  # the Makefile's loadtest-short
lane2 "$@" &
lane2_pid=$!
trap 'kill -INT "$lane2_pid" 2>/dev/null; pkill -INT -P "$lane2_pid" 2>/dev/null; wait' INT TERM
echo "tests: beside these, the other tests (log: $log_others), then the longest Ray modules (log: $log_ray), then the short load test (log: $log_load)"
stack_args=(-m "$STACK")
if [ $# -eq 0 ]; then
  for f in "${RAY_SPLIT[@]}"; do stack_args+=(--ignore="$f"); done
fi

"$PY" -m pytest "${common[@]}" $(junit stack) "${stack_args[@]}" "$@"
worst=$?
summary="stack $worst"
all_empty=$(( worst == 5 ))  # pytest's 5, "no test selected": fine for some runs (a single file), not all
[ "$worst" -eq 5 ] && worst=0
echo "tests: the stack tests done ($summary); waiting for the others"
wait "$lane2_pid"
trap - INT TERM
for part in others ray load; do
  log=$log_others
  [ "$part" = ray ] && log=$log_ray
  [ "$part" = load ] && log=$log_load
  if [ "$part" != others ] && [ "$#" -gt 0 ]; then continue; fi  # not run: arguments given
  rc=$(cat "$log.rc" 2>/dev/null || echo 1)  # no status: that run never finished, a failure
  echo "================ the $part tests ================"
  cat "$log"
  summary="$summary, $part $rc"
  [ "$rc" -ne 5 ] && all_empty=0
  [ "$rc" -eq 5 ] && rc=0
  [ "$rc" -gt "$worst" ] && worst=$rc
done
echo "tests: exit codes: $summary"
[ "$all_empty" -eq 1 ] && exit 5
exit "$worst"
