#!/usr/bin/env bash
# `make test`: the whole suite as two pytest runs side by side, so the tests that wait on Ray or a
# browser overlap with the ones that keep a core busy on Redis and Lua. The Ray and browser tests
# ("stack": markers ray, ray_cluster, browser) run one after another in this process's pytest, in
# their usual order (one Ray cluster at a time; the shared `hitl up`s of tests/browser_stack.py
# intact); the rest run in a second pytest beside it, its output in a log printed at the end.
# Extra arguments go to both (e.g. -k, -x, --lf); the exit status is the worse of the two.
#   usage: scripts/run_tests.sh [PYTEST_ARGS...]      (PY: the interpreter, default .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STACK="ray or ray_cluster or browser"
log=$(mktemp -t hitl-tests-rest.XXXXXX.log)
# HITL_JUNIT_DIR: each half also writes its JUnit XML there (stack.xml, rest.xml): the per-test times
# scripts/slow_tests.py reads to keep `make test-fast` quick.
junit_stack=() junit_rest=()
if [ -n "${HITL_JUNIT_DIR:-}" ]; then
  mkdir -p "$HITL_JUNIT_DIR"
  junit_stack=(--junitxml="$HITL_JUNIT_DIR/stack.xml") junit_rest=(--junitxml="$HITL_JUNIT_DIR/rest.xml")
fi

"$PY" -m pytest -q -p no:cacheprovider --durations=20 -m "not ($STACK)" "${junit_rest[@]}" "$@" >"$log" 2>&1 &
rest=$!
trap 'kill -INT "$rest" 2>/dev/null; wait "$rest" 2>/dev/null' INT TERM
echo "tests: the Ray and browser tests below; the other tests run beside them (log: $log)"

"$PY" -m pytest -q -p no:cacheprovider --durations=20 -m "$STACK" "${junit_stack[@]}" "$@"
stack_rc=$?
echo "tests: Ray and browser tests done (exit $stack_rc); waiting for the others"
wait "$rest"
rest_rc=$?
trap - INT TERM
echo "================ the other tests (no Ray, no browser) ================"
cat "$log"

# pytest's 5 means "no test selected": fine for one half (arguments that pick a single file), not both.
if [ "$stack_rc" -eq 5 ] && [ "$rest_rc" -eq 5 ]; then exit 5; fi
[ "$stack_rc" -eq 5 ] && stack_rc=0
[ "$rest_rc" -eq 5 ] && rest_rc=0
echo "tests: Ray and browser exit $stack_rc, the others exit $rest_rc"
exit $(( stack_rc > rest_rc ? stack_rc : rest_rc ))
