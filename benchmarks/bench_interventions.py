"""Interventions per second and latency by outcome through three doors, with the same mix:

(a) Ray Serve — a real ``hitl up --no-ui`` (proxy → Api replica → store → Redis);
(b) the same FastAPI app under plain uvicorn, alone in its process (``harness.uvicorn.UvicornServer``);
(c) the store itself (``Store.intervene``: one HGETALL + the consume_pause Lua script) — the ceiling.

All three use the Redis of the ``hitl up``, whose dispatcher takes the follow-up commands of every
door alike. The waiting jobs are made beforehand through the store (``create_job`` + a detection
report), so only the intervention path is timed. Each job gets the same six requests, in order:
a wrong ``pause_token`` (409 PAUSE_TOKEN_MISMATCH), the real submission (200), the same again
(replay), the same id with other boxes (409 IDEMPOTENCY_CONFLICT), a new id on the old version
(409 VERSION_CONFLICT) and a new id on the new version (409 PAUSE_NOT_ACTIVE). The submission is an
empty list by default (EMPTY_SELECTION: no model work follows to compete for the CPU and blur the
doors); ``--consume keep`` submits two model boxes instead, so the dispatcher runs the next node
meanwhile (and a late PAUSE_NOT_ACTIVE may turn into VERSION_CONFLICT). Latency is bucketed by the
outcome actually seen, next to each door's floor (Redis PING, ``GET /healthz``). The doors are
interleaved in rounds so drift on a shared machine hits them alike.

    python benchmarks/bench_interventions.py [--jobs 100] [--concurrency 1,8] [--rounds 2] [--consume empty|keep]
        [--api-url URL --redis-url URL --data-dir DIR [--token T]]   # reuse a running `hitl up`
        [--json benchmarks/out/bench_interventions.json] [--docs docs/benchmarks.md]

``make loadtest`` runs it against the load test's own ``hitl up`` once locust and the invariant
check are done (``loadtest/run.py``), ``make bench`` on a fresh one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.executor import report
from harness.hitl_up import HitlUp
from harness.tokens import resolve_token
from harness.uvicorn import UvicornServer
from loadtest.check_invariants import read_outboxes
from loadtest.common import format_table, outcome, percentile, request_id
from statecore.errors import HitlError
from statecore.models import ImageRef, InterventionRequest
from statecore.store import Store

DOORS = ("direct", "uvicorn", "ray")
DOOR_TITLES = {"direct": "store (Lua ceiling)", "uvicorn": "FastAPI + uvicorn", "ray": "Ray Serve (hitl up)"}
SECTION = "## Interventions under load"
BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [150, 40, 250, 200], "label": "shoe", "score": 0.88},
    {"bbox": [260, 100, 310, 230], "label": "hand", "score": 0.41},
]


@dataclass
class BenchJob:
    job_id: str
    version: int
    token: str
    boxes: list[dict[str, Any]]


def mix(job: BenchJob, consume: str = "empty") -> list[tuple[str, dict[str, Any]]]:
    """The six requests of one job: (expected outcome, body). ``consume`` is what the 200 submits:
    ``empty`` (EMPTY_SELECTION: no model work follows) or ``keep`` (two model boxes: a
    PROCESS_APPROVED_BOX_LIST command the server's dispatcher then runs)."""
    iid = f"iv_bench_{uuid.uuid4().hex[:16]}"
    keep = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in job.boxes[:2]]
    chosen = keep if consume == "keep" else []
    ok = {"intervention_id": iid, "pause_token": job.token, "base_version": job.version, "subjects": chosen}
    return [
        ("409 PAUSE_TOKEN_MISMATCH", {**ok, "intervention_id": iid + "_t", "pause_token": "pause_" + "0" * 20}),
        ("200", ok),
        ("replay", ok),
        ("409 IDEMPOTENCY_CONFLICT", {**ok, "subjects": keep[:1]}),
        ("409 VERSION_CONFLICT", {**ok, "intervention_id": iid + "_v"}),
        ("409 PAUSE_NOT_ACTIVE", {**ok, "intervention_id": iid + "_p", "base_version": job.version + 1}),
    ]


# --------------------------------------------------------------------------- jobs


async def settle(store: Store, job_ids: set[str], timeout: float) -> None:
    """Until no outbox command of these jobs is pending, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outbox = await read_outboxes(store.r)
        if not any(c.pending for j in job_ids for c in outbox.get(j, [])):
            return
        await asyncio.sleep(0.3)


async def make_jobs(store: Store, n: int, submitter: str, attempts: int = 5) -> list[BenchJob]:
    """``n`` jobs waiting for review, made through the store (no model, no upload).

    The server's dispatcher sees each job's DETECT command too. Usually it finds the node already
    reported and skips it; when it wins the race it runs the detector on an image that does not
    exist and the job fails. Such jobs are left out and replaced."""
    out: list[BenchJob] = []
    for _ in range(attempts):
        ids = []
        for _ in range(n - len(out)):
            sha = uuid.uuid4().hex * 2
            image = ImageRef(sha256=sha, width=320, height=240, url=f"/api/v1/artifacts/img_bench_{sha[:16]}.png")
            reply = await store.create_job(submitter, image)
            await report(store, reply.job_id, {"boxes": BOXES})
            ids.append(reply.job_id)
        await settle(store, set(ids), 10)  # let the dispatcher see (and skip) their DETECT commands first
        for job_id in ids:
            st = await store.get(job_id)
            if st.active_pause is not None and st.active_pause.status == "WAITING":
                out.append(
                    BenchJob(
                        job_id,
                        st.version,
                        st.active_pause.pause_token,
                        [b.model_dump(mode="json") for b in st.box_list],
                    )
                )
        if len(out) >= n:
            break
    return out


# --------------------------------------------------------------------------- doors


@dataclass
class Door:
    """``prepare`` turns a body into what ``send`` takes (untimed); ``send`` returns the outcome (timed);
    ``floor`` is the cheapest round trip through the same door (``GET /healthz``, or a Redis PING)."""

    prepare: Callable[[dict[str, Any]], Any]
    send: Callable[[str, Any], Awaitable[str]]
    floor: Callable[[], Awaitable[Any]]


def http_door(client: httpx.AsyncClient) -> Door:
    async def send(job_id: str, payload: bytes) -> str:
        r = await client.post(
            f"/api/v1/jobs/{job_id}/interventions",
            content=payload,
            headers={"Content-Type": "application/json", "X-Request-ID": request_id("bench")},
        )
        try:
            js = r.json() if r.status_code != 200 else None
        except ValueError:
            js = None
        return outcome(r.status_code, r.headers.get("Idempotent-Replayed") == "true", js)

    async def floor() -> Any:
        return await client.get("/healthz")

    return Door(lambda body: json.dumps(body).encode(), send, floor)


def store_door(store: Store, reviewer: str) -> Door:
    async def send(job_id: str, req: InterventionRequest) -> str:
        try:
            reply = await store.intervene(job_id, req, reviewer)
        except HitlError as e:
            return f"{e.status} {e.code}"
        return "replay" if reply.replayed else str(reply.status_code)

    return Door(InterventionRequest.model_validate, send, store.r.ping)


async def drive(
    door: Door, jobs: list[BenchJob], concurrency: int, consume: str = "empty"
) -> tuple[list[tuple[str, str, float]], float]:
    """Each worker takes a job and sends its six requests in order; (expected, got, ms) per request."""
    queue = list(reversed(jobs))
    samples: list[tuple[str, str, float]] = []

    async def worker() -> None:
        while queue:
            job = queue.pop()
            for expected, body in mix(job, consume):
                payload = door.prepare(body)
                t0 = time.perf_counter()
                got = await door.send(job.job_id, payload)
                samples.append((expected, got, (time.perf_counter() - t0) * 1000))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - t0


async def floor(door: Door, n: int, concurrency: int) -> list[float]:
    """Latencies (ms) of ``n`` cheapest round trips through the door, ``concurrency`` at a time."""
    left = [n]
    out: list[float] = []

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = time.perf_counter()
            await door.floor()
            out.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


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


# --------------------------------------------------------------------------- the benchmark


async def bench(
    api_ray: str,
    api_uvicorn: str,
    redis_url: str,
    token: str,
    *,
    jobs: int,
    concurrency: list[int],
    rounds: int,
    consume: str = "empty",
    warmup: int = 10,
) -> dict[str, Any]:
    store = Store.from_url(redis_url, max_connections=256)
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=max(concurrency) + 4, max_keepalive_connections=max(concurrency) + 4)
    clients = {
        d: httpx.AsyncClient(base_url=u, headers=headers, limits=limits, timeout=30)
        for d, u in (("ray", api_ray), ("uvicorn", api_uvicorn))
    }
    try:
        who = (await clients["uvicorn"].get("/api/v1/whoami")).json()["name"]
        doors: dict[str, Door] = {
            "direct": store_door(store, who),
            "uvicorn": http_door(clients["uvicorn"]),
            "ray": http_door(clients["ray"]),
        }
        per_round = max(1, jobs // rounds)
        needed = (per_round * rounds + warmup) * len(DOORS) * len(concurrency)
        t0 = time.perf_counter()
        pool = await make_jobs(store, needed, who)
        prepared_s = time.perf_counter() - t0
        if len(pool) < needed:  # share what there is evenly: every door gets as many jobs
            per_round = max(1, (len(pool) // (len(DOORS) * len(concurrency)) - warmup) // rounds)
            print(
                f"bench: only {len(pool)} of {needed} prepared jobs are waiting; {per_round * rounds} per door "
                "and concurrency",
                file=sys.stderr,
            )
        results: dict[str, Any] = {}
        for c in concurrency:
            raw: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
            wall: dict[str, float] = defaultdict(float)
            floors: dict[str, list[float]] = defaultdict(list)
            for door in DOORS:  # warm connections, JITs and caches; not counted
                await drive(doors[door], [pool.pop() for _ in range(min(warmup, len(pool)))], c, consume)
            for _ in range(rounds):
                for door in DOORS:
                    take = [pool.pop() for _ in range(min(per_round, len(pool)))]
                    samples, w = await drive(doors[door], take, c, consume)
                    raw[door] += samples
                    wall[door] += w
                    floors[door] += await floor(doors[door], 50, c)
            results[str(c)] = {
                door: {**summarize(raw[door], wall[door]), "floor": stats(floors[door])} for door in DOORS
            }
        return {
            "jobs_prepared": needed,
            "prepare_s": round(prepared_s, 2),
            "jobs_per_door_per_concurrency": per_round * rounds,
            "rounds": rounds,
            "concurrency": concurrency,
            "consume": consume,
            "results": results,
            "comparison": compare(results),
            "machine": machine(redis_url),
        }
    finally:
        for client in clients.values():
            await client.aclose()
        await store.close()


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


# --------------------------------------------------------------------------- output


def tables(res: dict[str, Any]) -> str:
    out = []
    for c, doors in res["results"].items():
        cmp = res["comparison"][c]
        out.append(
            f"concurrency {c}: interventions/s  "
            + "  ".join(f"{DOOR_TITLES[d]}={doors[d]['per_second']}" for d in DOORS)
        )
        rows = []
        for k in outcomes(doors):
            cells = [k]
            for d in DOORS:
                s = doors[d]["all"] if k == "all" else doors[d]["by_outcome"].get(k)
                cells.append(f"{s['p50']}/{s['p95']}/{s['p99']} ({s['n']})" if s else "-")
            r = cmp["p50"].get(k)
            cells += [
                f"+{r['uvicorn_added_ms']} ({r['uvicorn_x']}x)" if r else "-",
                f"+{r['ray_added_ms']} ({r['ray_x']}x)" if r else "-",
            ]
            rows.append(cells)
        fl = [doors[d]["floor"] for d in DOORS]
        rows.append(
            ["floor (PING / GET /healthz)"] + [f"{f['p50']}/{f['p95']}/{f['p99']} ({f['n']})" for f in fl] + ["", ""]
        )
        out.append(
            format_table(
                [
                    "outcome",
                    "store p50/p95/p99 ms (n)",
                    "uvicorn p50/p95/p99 ms (n)",
                    "ray p50/p95/p99 ms (n)",
                    "uvicorn vs store p50",
                    "ray vs store p50",
                ],
                rows,
            )
        )
    out.append("verdict: " + verdict(res))
    return "\n".join(out)


def docs_section(res: dict[str, Any], loadtest: dict[str, Any] | None = None) -> str:
    m = res["machine"]
    consumed = (
        "an empty list (EMPTY_SELECTION, so no model work follows and nothing else competes for the CPU)"
        if res.get("consume", "empty") == "empty"
        else "two model boxes (the server's dispatcher then runs PROCESS_APPROVED_BOX_LIST, on the same cores)"
    )
    cmd = (
        f"python benchmarks/bench_interventions.py --jobs {res['jobs_per_door_per_concurrency']} --rounds "
        f"{res['rounds']} --concurrency {','.join(map(str, res['concurrency']))} --consume "
        f"{res.get('consume', 'empty')} --docs docs/benchmarks.md"
    )
    lines = [
        SECTION,
        "",
        f"Written by `{cmd}` (the same benchmark, smaller, runs at the end of `make loadtest`; JSON in "
        "`loadtest/out/` or `benchmarks/out/`). Measured on a "
        f"{m['cpus']}-core machine (Python {m['python']}, Redis {m['redis']}) with the client, the servers, "
        "Ray and Redis on the same cores and other work on the host, so absolute numbers are pessimistic and "
        "move from run to run (most at concurrency 8, where the cores are saturated); compare the doors within "
        "one run.",
        "",
        "Three doors, the same mix: (a) Ray Serve (`hitl up --no-ui`: proxy → Api replica), (b) the same "
        "FastAPI app under plain uvicorn in its own process, (c) `Store.intervene` called directly (one "
        "HGETALL + the consume_pause Lua script: the ceiling), all on the Redis of the `hitl up`. Waiting "
        "jobs are made through the store beforehand. Each job gets six requests in order: a wrong pause "
        "token (409 PAUSE_TOKEN_MISMATCH), the submission (200), the same again (replay), the same id with "
        "other boxes (409 IDEMPOTENCY_CONFLICT), a new id on the old version (409 VERSION_CONFLICT), a new "
        f"id on the new version (409 PAUSE_NOT_ACTIVE). The submission is {consumed}. Latencies are "
        "client-side (httpx for the HTTP doors), in ms, bucketed by the outcome seen; "
        f"{res['jobs_per_door_per_concurrency']} jobs per door and concurrency, doors interleaved over "
        f"{res['rounds']} rounds. *floor* is the cheapest round trip through each door (Redis PING, "
        "`GET /healthz`): what any request pays before the intervention path starts.",
        "",
    ]
    for c, doors in res["results"].items():
        cmp = res["comparison"][c]
        lines.append(f"### {c} concurrent client{'s' if c != '1' else ''}")
        lines.append("")
        lines.append(
            "| outcome | store p50 / p95 / p99 | uvicorn p50 / p95 / p99 | Ray Serve p50 / p95 / p99 "
            "| uvicorn − store (p50) | Ray − store (p50) | Ray ÷ uvicorn (p50) |"
        )
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for k in outcomes(doors) + ["floor"]:
            cells = [f"**{k}**" if k in ("all", "floor") else k]
            for d in DOORS:
                s = doors[d].get(k) if k in ("all", "floor") else doors[d]["by_outcome"].get(k)
                cells.append(f"{s['p50']:.2f} / {s['p95']:.2f} / {s['p99']:.2f}" if s and s["n"] else "–")
            r = cmp["p50"].get(k)
            cells += (
                [
                    f"+{r['uvicorn_added_ms']:.2f} ms ({r['uvicorn_x']}×)",
                    f"+{r['ray_added_ms']:.2f} ms ({r['ray_x']}×)",
                    f"{r['ray_over_uvicorn_x']}×",
                ]
                if r
                else ["", "", ""]
            )
            lines.append("| " + " | ".join(cells) + " |")
        t = cmp["per_second"]
        if all(t.values()):
            lines += [
                "",
                f"Interventions per second (the whole mix): store {t['direct']}, uvicorn {t['uvicorn']}, "
                f"Ray Serve {t['ray']} (uvicorn at {t['uvicorn'] / t['direct']:.0%} of the store's rate, "
                f"Ray Serve at {t['ray'] / t['direct']:.0%}, Ray Serve ÷ uvicorn "
                f"{t['ray'] / t['uvicorn']:.2f}×).",
                "",
            ]
    lines += ["**Result:** " + verdict(res), ""]
    if loadtest:
        lines += loadtest_lines(loadtest)
    return "\n".join(lines).rstrip() + "\n"


def verdict(res: dict[str, Any]) -> str:
    """The 5 ms target is judged at the lowest concurrency, where p50 is service time, not queueing."""
    cs = sorted(res["comparison"], key=int)
    out = []
    low = res["comparison"][cs[0]]
    a = low["p50"].get("all")
    fl = low["p50"].get("floor")
    if a:
        out.append(
            f"at concurrency {cs[0]} (service time, no queueing) the intervention path served by uvicorn adds "
            f"{a['uvicorn_added_ms']:.2f} ms at p50 over the direct store call: "
            f"{'within' if low['uvicorn_within_5ms_p50'] else 'OVER'} the 5 ms target"
            f"{'' if low['uvicorn_within_5ms_p50_every_outcome'] else ' (but not on every outcome)'}"
            + (f"; {fl['uvicorn_added_ms']:.2f} ms of it is the bare HTTP round trip (`/healthz`)" if fl else "")
            + f". Ray Serve adds {a['ray_added_ms']:.2f} ms at p50 ({a['ray_over_uvicorn_x']}× uvicorn's p50)"
        )
    for c in cs[1:]:
        cmp = res["comparison"][c]
        a, t = cmp["p50"].get("all"), cmp["per_second"]
        if a and all(t.values()):
            out.append(
                f"at concurrency {c} client, servers and Redis saturate the cores, so p50 is mostly queueing "
                f"(uvicorn +{a['uvicorn_added_ms']:.2f} ms, Ray Serve +{a['ray_added_ms']:.2f} ms) and the "
                f"rates compare the doors: store {t['direct']}/s, uvicorn {t['uvicorn']}/s, Ray Serve "
                f"{t['ray']}/s"
            )
    return (
        "; ".join(out) + ". The Ray Serve overhead (proxy hop plus the replica's request path around the same "
        "app) is stated as measured; it is not a target."
    )


def loadtest_lines(s: dict[str, Any]) -> list[str]:
    """The last locust run and its invariant check, as `loadtest.run` summarised them."""
    inv = s.get("invariants", {})
    lt = s.get("locust", {})
    cfg = s.get("config", {})
    out = [
        "### Last locust run (`python -m loadtest.run`)",
        "",
        f"{cfg.get('users')} users for {cfg.get('seconds')} s against `hitl up --no-ui --detector-delay-ms "
        f"{cfg.get('detector_delay_ms')}`; {lt.get('requests')} requests, {lt.get('server_errors')} 5xx, "
        f"{lt.get('checks_failed')} failed protocol checks; invariant check over {inv.get('jobs')} jobs: "
        f"{inv.get('breaches')} breaches.",
        "",
    ]
    for problem in s.get("problems", []):
        out.append(f"- {problem}")
    for k, v in inv.get("invariants", {}).items():
        if v.get("example"):
            out.append(f"- e.g. {k}: {v['example']}")
    if s.get("problems"):
        out.append("")
    out += ["| request | count | p50 ms | p95 ms |", "| --- | --- | --- | --- |"]
    for row in lt.get("rows", []):
        if row["type"] in ("POST", "GET"):
            out.append(f"| {row['name']} | {row['count']} | {row['p50']} | {row['p95']} |")
    out += ["", "| invariant | checked | breaches |", "| --- | --- | --- |"]
    for k, v in inv.get("invariants", {}).items():
        out.append(f"| {k} | {v['checked']} | {v['breaches']} |")
    return out + [""]


def write_docs(path: Path, section: str) -> None:
    """Replace (or append) this section only; other sections of the file are left as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip() + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[nxt + 1 :] if nxt >= 0 else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_against(
    hitl_api: str,
    redis_url: str,
    data_dir: Path,
    out_dir: Path,
    *,
    jobs: int,
    concurrency: list[int],
    rounds: int,
    consume: str = "empty",
    token: str | None = None,
) -> dict[str, Any]:
    """The benchmark against a running ``hitl up``; starts (and stops) the uvicorn door itself."""
    uv = UvicornServer(data_dir, redis_url, log_path=out_dir / "bench-uvicorn.log").start()
    try:
        tok = resolve_token(token, data_dir)
        return asyncio.run(
            bench(
                hitl_api, uv.api_url, redis_url, tok, jobs=jobs, concurrency=concurrency, rounds=rounds, consume=consume
            )
        )
    finally:
        uv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_interventions.py",
        description="Intervention throughput and latency: Ray Serve vs uvicorn vs store.",
    )
    ap.add_argument("--jobs", type=int, default=100, help="jobs per door and concurrency (6 requests each)")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated client concurrencies (default 1,8)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds the doors are interleaved over")
    ap.add_argument(
        "--consume",
        choices=["empty", "keep"],
        default="empty",
        help="what the 200 submits: empty (EMPTY_SELECTION, default) or keep (two model boxes, "
        "so the dispatcher runs the next node during the measurement)",
    )
    ap.add_argument("--api-url", default=None, help="a running `hitl up` (else one is started)")
    ap.add_argument("--redis-url", default=None, help="its Redis (with --api-url)")
    ap.add_argument("--data-dir", default=None, help="its data directory (with --api-url)")
    ap.add_argument("--token", default=None, help="its token (default HITL_TOKEN or <data-dir>/api-token)")
    ap.add_argument("--detector-delay-ms", type=int, default=80, help="for the `hitl up` started here")
    ap.add_argument("--out", default="benchmarks/out", help="folder for logs and JSON")
    ap.add_argument("--json", default=None, help="result JSON (default <out>/bench_interventions.json)")
    ap.add_argument("--docs", default=None, help="rewrite the 'Interventions under load' section of this file")
    ap.add_argument("--loadtest-summary", default=None, help="a loadtest.run summary JSON to add to the docs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    conc = [int(x) for x in args.concurrency.split(",") if x.strip()]
    hitl = None
    tmp = None
    try:
        if args.api_url:
            if not (args.redis_url and args.data_dir):
                ap.error("--api-url needs --redis-url and --data-dir")
            api, redis_url, data_dir = args.api_url, args.redis_url, Path(args.data_dir)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="hitl-ivbench-"))
            print("starting hitl up --no-ui ...", flush=True)
            hitl = HitlUp(tmp, "--detector-delay-ms", str(args.detector_delay_ms), log_path=out / "bench-hitl-up.log")
            hitl.start()
            if hitl.redis_url is None:
                raise RuntimeError("hitl up did not log where its embedded redis-server is")
            api, redis_url, data_dir = hitl.api_url, hitl.redis_url, tmp
        res = run_against(
            api,
            redis_url,
            data_dir,
            out,
            jobs=args.jobs,
            concurrency=conc,
            rounds=args.rounds,
            consume=args.consume,
            token=args.token,
        )
    finally:
        if hitl is not None:
            hitl.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(tables(res))
    path = Path(args.json) if args.json else out / "bench_interventions.json"
    path.write_text(json.dumps(res, indent=2))
    print(f"wrote {path}")
    if args.docs:
        lt = json.loads(Path(args.loadtest_summary).read_text()) if args.loadtest_summary else None
        write_docs(Path(args.docs), docs_section(res, lt))
        print(f"updated the '{SECTION[3:]}' section of {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
