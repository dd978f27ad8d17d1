"""The benchmark's numbers: latency statistics by outcome, the doors compared at p50, and the
machine they ran on."""

from __future__ import annotations

import os
import platform
from collections import defaultdict
from typing import Any

from loadtest.common import percentile
from loadtest.intervention_bench.doors import DOORS


def stats(v: list[float]) -> dict[str, Any]:
    v = sorted(v)
    return {
        "n": len(v),
        "p50": _r(percentile(v, 50)),
        "p95": _r(percentile(v, 95)),
        "p99": _r(percentile(v, 99)),
        "mean": _r(sum(v) / len(v)) if v else None,
    }


def summarize(samples: list[tuple[str, str, float]], wall_s: float) -> dict[str, Any]:
    by: dict[str, list[float]] = defaultdict(list)
    for _exp, got, ms in samples:
        by[got].append(ms)
    every = sorted(ms for _e, _g, ms in samples)

    unexpected = [(e, g) for e, g, _ in samples if e != g]
    return {
        "requests": len(samples),
        "wall_s": round(wall_s, 3),
        "per_second": round(len(samples) / wall_s, 1) if wall_s else None,
        "consumed_per_second": round(len(by.get("200", [])) / wall_s, 1) if wall_s else None,
        "all": stats(every),
        "by_outcome": {k: stats(v) for k, v in sorted(by.items())},
        "unexpected": len(unexpected),
        "unexpected_kinds": {f"{e} -> {g}": unexpected.count((e, g)) for e, g in set(unexpected)},
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def compare(results: dict[str, Any]) -> dict[str, Any]:
    """Ratios and added milliseconds at p50 against the store, per concurrency and outcome."""
    out: dict[str, Any] = {}
    for c, doors in results.items():
        rows: dict[str, Any] = {}
        for k in outcomes(doors) + ["floor"]:
            p = {
                d: (doors[d][k] if k in ("all", "floor") else doors[d]["by_outcome"].get(k, {})).get("p50")
                for d in DOORS
            }
            if not all(p.values()):
                continue
            rows[k] = {
                "p50_ms": p,
                "uvicorn_added_ms": round(p["uvicorn"] - p["direct"], 3),
                "ray_added_ms": round(p["ray"] - p["direct"], 3),
                "uvicorn_x": round(p["uvicorn"] / p["direct"], 2),
                "ray_x": round(p["ray"] / p["direct"], 2),
                "ray_over_uvicorn_x": round(p["ray"] / p["uvicorn"], 2),
            }
        tput = {d: doors[d]["per_second"] for d in DOORS}
        floor_p50 = {d: doors[d]["floor"]["p50"] for d in DOORS}
        mixed = rows.get("all")
        out[c] = {
            "p50": rows,
            "per_second": tput,
            "floor_p50_ms": floor_p50,
            "uvicorn_within_5ms_p50": mixed is not None and mixed["uvicorn_added_ms"] <= 5,
            "uvicorn_within_5ms_p50_every_outcome": all(
                r["uvicorn_added_ms"] <= 5 for k, r in rows.items() if k != "floor"
            ),
        }
    return out


# Ray Serve against uvicorn serving the same app (docs/benchmarks.md § Interventions under load).
P50_TARGET_X = 1.2  # Ray Serve's p50 at the lowest concurrency, at most this times uvicorn's
THROUGHPUT_TARGET_X = 0.8  # Ray Serve's rate at the highest concurrency, at least this times uvicorn's


def targets(comparison: dict[str, Any]) -> dict[str, Any]:
    """Ray Serve ÷ uvicorn: p50 (the whole mix) at the lowest concurrency, where p50 is service
    time; interventions per second at the highest, where the cores are saturated."""
    cs = sorted(comparison, key=int)
    low, high = comparison[cs[0]], comparison[cs[-1]]
    p50 = (low["p50"].get("all") or {}).get("ray_over_uvicorn_x")
    t = high["per_second"]
    tput = round(t["ray"] / t["uvicorn"], 2) if t.get("ray") and t.get("uvicorn") else None
    return {
        "p50_concurrency": int(cs[0]),
        "p50_ray_over_uvicorn_x": p50,
        "p50_target_x": P50_TARGET_X,
        "p50_met": p50 is not None and p50 <= P50_TARGET_X,
        "throughput_concurrency": int(cs[-1]),
        "throughput_ray_over_uvicorn_x": tput,
        "throughput_target_x": THROUGHPUT_TARGET_X,
        "throughput_met": tput is not None and tput >= THROUGHPUT_TARGET_X,
    }


def outcomes(doors: dict[str, Any]) -> list[str]:
    return ["all"] + sorted({k for d in DOORS for k in doors[d]["by_outcome"]})


def machine(redis_url: str) -> dict[str, Any]:
    import redis as redis_py

    info = redis_py.Redis.from_url(redis_url).info("server")
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis": info.get("redis_version"),
    }
