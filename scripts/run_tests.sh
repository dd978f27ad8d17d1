#!/usr/bin/env bash
# `make test`: the whole suite as three pytest runs side by side, so the tests that wait on Ray or a
# browser overlap with each other and with the ones that keep a core busy on Redis and Lua:
#   stack    the browser tests (their shared `hitl up`s of tests/browser_stack.py intact: those groups
#            span modules, so they stay in one pytest) and the Ray modules not named below;
#   ray      the Ray modules in RAY_SPLIT (the longest ones, ~16 min of the ~35 min the Ray and
#            browser tests take one after another on 2 cores), one Ray cluster at a time;
#   others   every test without the markers ray, ray_cluster or browser.
# The first prints as it goes; the other two log to files printed at the end. With arguments (-k, -x,
# a file, --lf) there is no split: they go to one stack pytest and one for the others, as a
# module list of RAY_SPLIT would otherwise run twice. The exit status is the worst of them.
#   usage: scripts/run_tests.sh [PYTEST_ARGS...]      (PY: the interpreter, default .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STACK="ray or ray_cluster or browser"
# Chosen from the per-test times of a full run (HITL_JUNIT_DIR below) so the two stack runs end
# close together: these ~960 s of Ray tests against the browser tests (~590 s) and the other Ray
# modules (~560 s).
RAY_SPLIT=(
  tests/test_autoscale.py tests/test_restart_same_port.py tests/test_serve_cli.py tests/test_e2e_serve.py
  tests/test_e2e_sam.py tests/test_ray_cluster.py tests/test_metrics_replicas.py tests/test_burst_bench_smoke.py
  tests/test_benchmarks_smoke.py tests/test_learning_loop_smoke.py tests/test_auto_approve_serve.py
)
# HITL_JUNIT_DIR: each run also writes its JUnit XML there (stack.xml, ray.xml, rest.xml): the per-test
# times scripts/slow_tests.py reads (rest.xml) to keep `make test-fast` quick.
junit() { [ -n "${HITL_JUNIT_DIR:-}" ] && echo "--junitxml=$HITL_JUNIT_DIR/$1.xml"; }
[ -n "${HITL_JUNIT_DIR:-}" ] && mkdir -p "$HITL_JUNIT_DIR"
common=(-q -p no:cacheprovider --durations=20)

pids=() logs=() names=()
beside() {  # NAME ARGS...: a pytest in the background, its output in a log
  local name=$1 log
  shift
  log=$(mktemp -t "hitl-tests-$name.XXXXXX.log")
  "$PY" -m pytest "${common[@]}" $(junit "$name") "$@" >"$log" 2>&1 &
  pids+=($!) logs+=("$log") names+=("$name")
  echo "tests: the $name tests run beside these (log: $log)"
}
trap 'for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done; wait' INT TERM

beside others -m "not ($STACK)" "$@"
stack_args=(-m "$STACK")
if [ $# -eq 0 ]; then
  beside ray -m "$STACK" "${RAY_SPLIT[@]}"
  for f in "${RAY_SPLIT[@]}"; do stack_args+=(--ignore="$f"); done
fi

"$PY" -m pytest "${common[@]}" $(junit stack) "${stack_args[@]}" "$@"
worst=$?
summary="stack $worst"
all_empty=$(( worst == 5 ))  # pytest's 5, "no test selected": fine for some runs (a single file), not all
[ "$worst" -eq 5 ] && worst=0
echo "tests: the stack tests done ($summary); waiting for the others"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "================ the ${names[$i]} tests ================"
  cat "${logs[$i]}"
  summary="$summary, ${names[$i]} $rc"
  [ "$rc" -ne 5 ] && all_empty=0
  [ "$rc" -eq 5 ] && rc=0
  [ "$rc" -gt "$worst" ] && worst=$rc
done
trap - INT TERM
echo "tests: exit codes: $summary"
[ "$all_empty" -eq 1 ] && exit 5
exit "$worst"
