"""The stop's steps without Ray (``serve_app.ops.stopping``): a step past its limit is left behind, a
second signal (``hurry``) cuts the step under way and skips the rest, the budget caps every step,
and what is left of the processes started is SIGKILLed by PID, also one that ignores SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from hitl_review.serve_app.ops.stopping import Stopper


def test_a_step_past_its_limit_is_left_behind():
    s = Stopper()
    s.begin(joined=False)
    t0 = time.monotonic()
    assert s.bounded("slow", lambda: time.sleep(5), 0.3) is False
    assert time.monotonic() - t0 < 1.0
    assert s.bounded("quick", lambda: None, 1.0) is True
    assert s.bounded("failing", lambda: 1 / 0, 1.0) is False


def test_a_second_signal_cuts_the_step_under_way_and_skips_the_rest():
    s = Stopper()
    s.begin(joined=False)
    threading.Timer(0.3, s.hurry.set).start()
    t0 = time.monotonic()
    assert s.bounded("slow", lambda: time.sleep(5), 4.0) is False
    assert time.monotonic() - t0 < 1.5
    ran = []
    assert s.bounded("next", lambda: ran.append(1), 4.0) is False
    assert ran == []


def test_the_budget_caps_every_step():
    s = Stopper()
    s.begin(joined=False)
    s.deadline = time.monotonic() + 0.4
    t0 = time.monotonic()
    assert s.bounded("slow", lambda: time.sleep(5), 4.0) is False
    assert time.monotonic() - t0 < 1.0
    assert s.bounded("after the budget", lambda: None, 4.0) is False


# Run in a process of its own: kill_stragglers kills every descendant of the process that calls
# it, which in pytest's own process would include the session's redis-server fixtures.
STRAGGLERS = """
import subprocess, sys, time
import psutil
from hitl_review.serve_app.ops.stopping import Stopper
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
for p in procs:
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    p.terminate()  # ignored
listed = [psutil.Process(p.pid) for p in procs]
s = Stopper()
s.begin(joined=False)
t0 = time.monotonic()
s.kill_stragglers(listed[:1])  # the second one is found as a child of this process
print(round(time.monotonic() - t0, 3), [p.wait(5) for p in procs], flush=True)
"""


def test_stragglers_are_killed_by_pid_even_when_they_ignore_sigterm():
    out = subprocess.run([sys.executable, "-c", STRAGGLERS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    took, codes = out.stdout.split(maxsplit=1)
    assert float(took) < 2.5 and codes.strip() == "[-9, -9]", out.stdout
