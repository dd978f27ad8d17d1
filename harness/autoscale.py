"""Watching a Serve deployment's replicas from outside, and drawing them.

``ReplicaWatcher`` polls Serve's status API (the dashboard's ``/api/serve/applications/``, what
``serve status`` reads) in a thread and keeps one sample per poll: seconds since the start, replicas
RUNNING, replicas on the way (STARTING, PENDING_MIGRATION, …), the autoscaler's target and the
deployment's status. ``svg`` draws those samples as a step plot with no plotting library;
``python -m harness.autoscale IN.json OUT.svg`` redraws a recorded run (``docs/scaling.md``).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx


class ReplicaWatcher:
    def __init__(
        self, dashboard_url: str, app: str, deployment: str, headers: dict[str, str], period_s: float = 0.5
    ) -> None:
        self.url = f"{dashboard_url}/api/serve/applications/"
        self.app, self.deployment, self.headers, self.period_s = app, deployment, headers, period_s
        self.samples: list[dict[str, Any]] = []
        self.marks: list[dict[str, Any]] = []  # events of the scenario, drawn as vertical lines
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-watcher", daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> ReplicaWatcher:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def mark(self, label: str) -> None:
        self.marks.append({"t": round(time.monotonic() - self.t0, 2), "label": label})

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples

    @property
    def last(self) -> dict[str, Any] | None:
        return self.samples[-1] if self.samples else None

    def _run(self) -> None:
        with httpx.Client(headers=self.headers, timeout=10) as c:
            while not self._stop.is_set():
                try:
                    sample = self._sample(c.get(self.url).json())
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    sample = None  # a slow or restarting dashboard: skip this poll
                if sample is not None:
                    self.samples.append(sample)
                self._stop.wait(self.period_s)

    def _sample(self, details: dict[str, Any]) -> dict[str, Any]:
        d = details["applications"][self.app]["deployments"][self.deployment]
        states = [r.get("state") for r in d.get("replicas") or []]
        return {
            "t": round(time.monotonic() - self.t0, 2),
            "running": states.count("RUNNING"),
            "starting": sum(1 for s in states if s not in ("RUNNING", "STOPPING")),
            "stopping": states.count("STOPPING"),
            "target": d.get("target_num_replicas"),
            "status": d.get("status"),
        }

    def record(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "samples": self.samples, "marks": self.marks}


def svg(record: dict[str, Any], title: str, width: int = 720, height: int = 300) -> str:
    """A step plot of running replicas (solid) and the autoscaler's target (dashed) over time."""
    samples = record["samples"]
    left, right, top, bottom = 50, 20, 36, 40
    t_max = max([s["t"] for s in samples] + [1.0])
    y_max = max([s["running"] for s in samples] + [s["target"] or 0 for s in samples] + [1])
    pw, ph = width - left - right, height - top - bottom

    def x(t: float) -> float:
        return left + pw * t / t_max

    def y(v: float) -> float:
        return top + ph * (1 - v / y_max)

    def steps(key: str) -> str:
        pts: list[str] = []
        prev: float | None = None
        for s in samples:
            v = s[key] or 0
            if prev is not None and v != prev:
                pts.append(f"{x(s['t']):.1f},{y(prev):.1f}")
            pts.append(f"{x(s['t']):.1f},{y(v):.1f}")
            prev = v
        return " ".join(pts)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
    ]
    for v in range(y_max + 1):
        out.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#eee"/>')
    step = 10 if t_max > 40 else 5
    for t in range(0, int(t_max) + 1, step):
        out.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">seconds</text>')
    for m in record.get("marks", []):
        out.append(f'<line x1="{x(m["t"]):.1f}" y1="{top}" x2="{x(m["t"]):.1f}" y2="{top + ph}" stroke="#999"/>')
        out.append(f'<text x="{x(m["t"]) + 3:.1f}" y="{top + 12}" fill="#666">{m["label"]}</text>')
    out.append(f'<polyline points="{steps("target")}" fill="none" stroke="#d62728" stroke-dasharray="5,4"/>')
    out.append(f'<polyline points="{steps("running")}" fill="none" stroke="#1f77b4" stroke-width="2.5"/>')
    lx = left + pw - 190
    out.append(f'<line x1="{lx}" y1="{top + ph - 30}" x2="{lx + 24}" y2="{top + ph - 30}" stroke="#1f77b4" ')
    out[-1] += 'stroke-width="2.5"/>'
    out.append(f'<text x="{lx + 30}" y="{top + ph - 26}">replicas RUNNING</text>')
    out.append(f'<line x1="{lx}" y1="{top + ph - 12}" x2="{lx + 24}" y2="{top + ph - 12}" stroke="#d62728" ')
    out[-1] += 'stroke-dasharray="5,4"/>'
    out.append(f'<text x="{lx + 30}" y="{top + ph - 8}">autoscaler target</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="draw a recorded autoscaling run (JSON) as an SVG step plot")
    ap.add_argument("json_in", type=Path)
    ap.add_argument("svg_out", type=Path)
    args = ap.parse_args()
    rec = json.loads(args.json_in.read_text())
    args.svg_out.write_text(svg(rec, rec.get("title") or f"{rec['deployment']} replicas"))


if __name__ == "__main__":
    main()
