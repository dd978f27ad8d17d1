"""The learning loop on a shop the models have not seen (issue 36, docs/learning.md): reviewed jobs pile
up in the archive, `hitl learn box-policy` fits a policy at checkpoints, `hitl up --auto-approve on`
runs it on fresh jobs, and a mid-run switch of domain shows when the live check drops it to shadow.

Everything goes through the product: a real ``hitl up`` (embedded Redis, local Ray, Ray Serve; the
classical OpenCV detector, the one whose mistakes the policy must learn), the HTTP API (``POST
/jobs``, each job's SSE stream, ``POST /interventions``), the archive it writes, and the ``hitl learn``
CLI on that archive. No learning code is called for the loop; ``statecore.autoapprove`` is used once,
offline, for the drift *prediction* printed before the drift is run, and ``upper_bound`` / ``lower_bound``
(SciPy's exact Clopper–Pearson) for the table's intervals.

The jobs are ``benchmarks/cutout_data.py`` images (``--domain`` split and ``--seed``): neither the
detector nor any policy saw them. Simulated reviewers act from the ground truth and do not wait:

- a detected box matching a true subject at IoU >= ``--keep-iou`` is kept as it is; one matching at
  IoU >= 0.5 is moved onto the truth; every other detection is deleted; every subject left unmatched is
  drawn (its true box and label); so a job is "unchanged" exactly when every detection is kept and
  nothing is drawn: what ``hitl learn`` reads as an approval of the detector's list;
- a second round (hand-drawn boxes the validator rejected) and a mask review are answered keeping
  what is shown (the defaults here have neither: ``--validator null``, ``--segmenter null``,
  ``--quality-gate off``, the knobs this needs to fit thousands of jobs on 2 cores; the policy decides
  boxes only, so the segmenter does not change what is measured).

The person-time a review stands for is not waited: it is counted as ``--page-s`` (the reviewer
benchmark's measured page time per review: N → interactive 2.39 s + submit → banner 1.16 s, 1 reviewer,
docs/benchmarks.md § Reviewer) + ``--look-s`` (an assumption: a person judging the list) +
``--edit-s`` per box moved, deleted or drawn (an assumption). Person-minutes per 1,000 images before
(every job reviewed) → after (only those the policy sent to a person, spot checks included), on the same
fresh images.

At each ``--checkpoints`` count of reviewed jobs (``hitl learn dataset``'s count) ``hitl learn
box-policy`` runs for each ``--promises`` rate. When one is written, ``hitl up`` restarts with
``--auto-approve on --auto-approve-policy FILE --spot-check S`` (the tightest promise written) and
``--fresh`` new jobs of the same domain are measured: share approved automatically, their false
accepts judged from the ground truth with the exact upper bound, person-minutes. Then ``hitl learn mode
off`` and the learning stream goes on. After the last checkpoint with a policy, the stream switches to
``--drift-domain``: the prediction (from the spot-check share, the policy's promise and an offline
estimate of its approvals and false accepts on the new domain) is printed first, then jobs run until
the live check drops the policy to shadow (Redis' ``box_policy`` record) or ``--drift-max`` jobs.

    .venv/bin/python benchmarks/learning_loop.py --checkpoints 500,1000,2000 --fresh 400 \\
        --json benchmarks/out/learning_loop.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks import cutout_data
from benchmarks.learning_stream import Domain, Job, Stream, review
from harness.bench import log, stop_on_sigterm
from harness.hitl_up import HitlUp
from hitl_review.statecore.autoapprove import EVIDENCE_FEATURES, lower_bound, upper_bound

CLI = [sys.executable, "-m", "hitl_review.serve_app.cli"]
BASE_FLAGS = ("--detector", "classical", "--segmenter", "null", "--validator", "null", "--quality-gate", "off")


# --------------------------------------------------------------------------- the CLI


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=600)


def dataset(data_dir: Path, out: Path, at_least: int, timeout: float = 180) -> int:
    """``hitl learn dataset`` until it holds ``at_least`` reviewed jobs (the archive lags the finish)."""
    deadline = time.monotonic() + timeout
    while True:
        p = cli("learn", "dataset", "--data-dir", str(data_dir), "--out", str(out))
        m = re.search(r"learn dataset: (\d+) reviewed jobs", p.stdout)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"hitl learn dataset: {p.stdout} {p.stderr[-2000:]}")
        n = int(m.group(1))
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(2)


def fit(data_dir: Path, rows: Path, out: Path, promise: float, confidence: float) -> dict[str, Any]:
    """``hitl learn box-policy`` on the archive's data set: the file's evidence, or the refusal and the
    tightest bound its cleanest threshold could claim."""
    p = cli(
        "learn", "box-policy", "--data-dir", str(data_dir), "--dataset", str(rows), "--out", str(out),
        "--max-false-accept", str(promise), "--confidence", str(confidence), "--name", f"shop-{promise}",
    )  # fmt: skip
    res: dict[str, Any] = {"promise": promise, "rc": p.returncode, "said": (p.stdout + p.stderr).strip()[-600:]}
    if p.returncode == 0:
        doc = json.loads(out.read_text())
        res.update(written=str(out), threshold=doc["threshold"], evidence=doc["evidence"])
        res["reads_evidence"] = any(f in EVIDENCE_FEATURES for f in doc["model"]["features"])
        res["ref"] = re.search(r"(policy:\S+@[0-9a-f]{16})", p.stdout).group(1)  # type: ignore[union-attr]
        res["bound"] = doc["evidence"]["false_accept_upper"]
    else:
        m = re.search(r"the best threshold approved (\d+)", p.stderr)
        clean = int(m.group(1)) if m else 0
        res.update(written=None, clean_approved=clean, bound=upper_bound(0, clean, confidence))
    return res


def without_evidence(rows: Path) -> tuple[Path, float]:
    """The data set ``rows`` with the detector's evidence taken off every box (the ablation: what the
    policy's own features bound without it), beside it; and the share of rows whose every box carried
    it (the Detector's report, through the job and the archive)."""
    blind = rows.with_name(rows.stem + "-no-evidence.jsonl")
    n = seen = 0
    with rows.open() as src, blind.open("w") as dst:
        for line in src:
            row = json.loads(line)
            n += 1
            seen += all(isinstance(b.get("evidence"), dict) for b in row.get("boxes") or [])
            for b in row.get("boxes") or []:
                b.pop("evidence", None)
            dst.write(json.dumps(row) + "\n")
    return blind, seen / max(n, 1)


# --------------------------------------------------------------------------- figures


def person_s(jobs: list[Job], args: argparse.Namespace, only_people: bool) -> float:
    total = 0.0
    for j in jobs:
        if only_people and j.auto:
            continue
        v = j.verdict
        total += args.page_s + args.look_s + args.edit_s * (v.get("moved", 0) + v.get("deleted", 0) + v.get("drawn", 0))
    return total


def measure(jobs: list[Job], args: argparse.Namespace, promise: float) -> dict[str, Any]:
    n = len(jobs)
    auto = [j for j in jobs if j.auto]
    fa = sum(1 for j in auto if not j.verdict.get("unchanged"))
    spots = [j for j in jobs if j.spot]
    before = person_s(jobs, args, only_people=False) / 60 / max(n, 1) * 1000
    after = person_s(jobs, args, only_people=True) / 60 / max(n, 1) * 1000
    c = args.confidence
    return {
        "jobs": n,
        "auto_approved": len(auto),
        "auto_share": len(auto) / n if n else 0.0,
        "auto_share_ci": [lower_bound(len(auto), n, 0.975), upper_bound(len(auto), n, 0.975)],
        "false_accepts": fa,
        "false_accept_rate": fa / len(auto) if auto else 0.0,
        "false_accept_upper": upper_bound(fa, len(auto), c),
        "promise": promise,
        "bound_holds": upper_bound(fa, len(auto), c) <= promise,
        "spot_checks": len(spots),
        "spot_false_accepts": sum(1 for j in spots if j.spot_fa),
        "unchanged_share_truth": sum(1 for j in jobs if j.verdict.get("unchanged")) / n if n else 0.0,
        "person_min_per_1000_before": before,
        "person_min_per_1000_after": after,
        "statuses": {s: sum(1 for j in jobs if j.status == s) for s in {j.status for j in jobs}},
    }


def drop_prediction(
    policy_file: Path, domain: Domain, first: int, n: int, spot: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Before the drift: the policy's approvals and their false-accept share on ``n`` images of the new
    domain (the deployment's detector run here, offline), and from them, the spot-check share and the
    live check's rule (lower bound > promise), after how many jobs it should drop to shadow."""
    from hitl_review.deployments.backends.classical import ClassicalDetector
    from hitl_review.statecore.autoapprove import load

    policy = load(policy_file.read_text(), "on")
    det = ClassicalDetector()
    would = fa = 0
    for i in range(first, first + n):
        s = cutout_data.make_sample(domain.split, i, domain.seed)
        h, w = s.image.shape[:2]
        boxes = [{**b, "box_id": f"b{k}"} for k, b in enumerate(det.detect(s.image, "x"))]
        if boxes and policy.probability(boxes, w, h) >= policy.threshold:
            would += 1
            truth = [{"bbox": x.bbox, "label": x.label} for x in s.subjects]
            fa += not review(boxes, truth, args.keep_iou)["unchanged"]
    a, f = would / n, (fa / would if would else 0.0)
    n0, k0 = spot
    r, conf = policy.max_false_accept, policy.confidence
    # the spot checks after the switch needed, each a false accept with probability f: the expected
    # count first (k rounded), then the jobs they take at a·S spot checks per job
    m = None
    for extra in range(1, 100_000):
        k = k0 + math.floor(extra * f + 0.5)
        if lower_bound(k, n0 + extra, conf) > r:
            m = extra
            break
    rate = a * args.spot_check
    first_fa_jobs = 1 / (rate * f) if rate * f > 0 else math.inf
    return {
        "preview_images": n,
        "would_approve_share": a,
        "false_accept_share_of_approved": f,
        "spot_checks_before": n0,
        "spot_false_accepts_before": k0,
        "spot_checks_needed": m,
        "jobs_predicted": (m / rate) if (m and rate > 0) else None,
        "jobs_to_first_spot_false_accept": first_fa_jobs,
        "auto_false_accepts_predicted": (a * (1 - args.spot_check) * f * m / rate) if (m and rate > 0) else None,
    }


# --------------------------------------------------------------------------- the run


class Loop:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(args.data_dir or tempfile.mkdtemp(prefix="hitl-learning-loop-"))
        self.up: HitlUp | None = None
        self.stream: Stream | None = None
        self.next_index = 0
        self.out: dict[str, Any] = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
            "checkpoints": [],
        }

    def save(self) -> None:
        Path(self.args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(self.args.json).write_text(json.dumps(self.out, indent=2, default=str))

    async def start(self, *flags: str) -> None:
        await self.stop()
        # A loaded 2-core host answers a replica's health check late: Serve's 5 s would restart the model
        # replicas in a loop (seen at a load average of 30-57), so they get a minute (hitl up --config).
        patient = {"health_check_period_s": 10.0, "health_check_timeout_s": 60.0}
        config = self.dir / "deployments.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        config.write_text(
            json.dumps({"deployments": dict.fromkeys(("Detector", "BoxValidator", "Segmenter"), patient)})
        )
        all_flags = [*BASE_FLAGS, "--config", str(config), *flags, *(self.args.hitl_arg or [])]
        log(f"starting hitl up {' '.join(all_flags)} in {self.dir / 'hitl'}")
        t0 = time.monotonic()
        for attempt in range(1, 7):  # Ray gives its raylet 30 s to start: a loaded host can miss it
            try:
                self.up = HitlUp(self.dir / "hitl", *all_flags, log_path=self.dir / "hitl-up.log").start(timeout=600)
                break
            except RuntimeError as e:
                if attempt == 6:
                    raise
                log(f"hitl up did not start ({str(e)[-200:]}); again")
        assert self.up is not None
        log(f"hitl up ready in {time.monotonic() - t0:.0f}s")
        self.stream = Stream(self.up, self.args)

    async def stop(self) -> None:
        if self.stream is not None:
            await self.stream.close()
            self.stream = None
        if self.up is not None:
            self.up.stop()
            self.up = None

    async def jobs(self, domain: Domain, count: int, stop: Any = None) -> list[Job]:
        assert self.stream is not None
        first = self.next_index
        self.next_index += count
        t0 = time.monotonic()
        done = await self.stream.run(domain, range(first, first + count), stop)
        self.next_index = first + max((j.index for j in done), default=first - 1) - first + 1
        log(f"{len(done)} jobs of {domain.split}/{domain.seed} in {time.monotonic() - t0:.0f}s")
        return done

    async def policy_mode(self) -> str:
        import redis.asyncio as aioredis

        from hitl_review.statecore import keys

        assert self.up is not None and self.up.redis_url
        r = aioredis.from_url(self.up.redis_url, decode_responses=True)
        try:
            return str(await r.hget(keys.BOX_POLICY, "mode") or "")
        finally:
            await r.aclose()

    async def run(self) -> dict[str, Any]:
        a = self.args
        learn = Domain(a.domain, a.seed)
        fresh = Domain(a.domain, a.seed + 1)  # images never used for learning
        drift = Domain(a.drift_domain, a.seed + 2)
        rows = self.dir / "dataset.jsonl"
        await self.start()
        reviewed = 0
        learning: list[Job] = []
        last_policy: dict[str, Any] | None = None
        on_jobs: list[Job] = []
        try:
            for c in a.checkpoints:
                while reviewed < c:
                    batch = await self.jobs(learn, c - reviewed)
                    learning += batch
                    reviewed += sum(1 for j in batch if j.reviewed)
                archived = dataset(self.dir / "hitl", rows, reviewed)
                log(f"checkpoint {c}: {archived} reviewed jobs in the archive")
                point: dict[str, Any] = {"checkpoint": c, "dataset_rows": archived, "fits": []}
                blind, point["rows_with_evidence"] = without_evidence(rows)
                point["fits_without_evidence"] = []
                for promise in a.promises:
                    res = fit(self.dir / "hitl", rows, self.dir / f"policy-{c}-{promise}.json", promise, a.confidence)
                    log(f"  box-policy R={promise}: {res['said'][:240]}")
                    point["fits"].append(res)
                    res = fit(self.dir / "hitl", blind, self.dir / f"blind-{c}-{promise}.json", promise, a.confidence)
                    log(f"  box-policy R={promise}, the evidence taken off: {res['said'][:160]}")
                    point["fits_without_evidence"].append(res)
                written = [f for f in point["fits"] if f["written"]]
                if written:
                    best = min(written, key=lambda f: f["promise"])
                    point["evaluated"] = best["ref"]
                    await self.start(
                        "--auto-approve", "on", "--auto-approve-policy", best["written"],
                        "--spot-check", str(a.spot_check),
                    )  # fmt: skip
                    ev = await self.jobs(fresh, a.fresh)
                    point["fresh"] = measure(ev, a, best["promise"])
                    log(f"  fresh: {json.dumps(point['fresh'])}")
                    last_policy = best
                    on_jobs = ev
                    if c != a.checkpoints[-1]:
                        p = cli(
                            "learn", "mode", "off", "--policy", best["written"], "--data-dir", str(self.dir / "hitl")
                        )
                        log(f"  {p.stdout.strip()} {p.stderr.strip()}")
                    reviewed = archived + sum(1 for j in ev if j.reviewed)
                self.out["checkpoints"].append(point)
                self.save()  # what is measured so far survives a run stopped later
            self.out["learning_stream"] = {
                "jobs": len(learning),
                "unchanged_share_truth": sum(1 for j in learning if j.verdict.get("unchanged")) / max(len(learning), 1),
            }
            if last_policy is not None and a.drift_max > 0:
                self.out["drift"] = await self.drift(last_policy, drift, on_jobs)
        finally:
            await self.stop()
        return self.out

    async def drift(self, policy: dict[str, Any], drift: Domain, on_jobs: list[Job]) -> dict[str, Any]:
        a = self.args
        if await self.policy_mode() == "off":  # a later checkpoint wrote none: the last one written, on again
            p = cli("learn", "mode", "on", "--policy", policy["written"], "--data-dir", str(self.dir / "hitl"))
            log(f"  {p.stdout.strip()} {p.stderr.strip()}")
        if await self.policy_mode() != "on":
            return {"skipped": "the policy was no longer on before the drift (dropped during the fresh stream)"}
        spot = (sum(1 for j in on_jobs if j.spot), sum(1 for j in on_jobs if j.spot_fa))
        pred = drop_prediction(Path(policy["written"]), drift, 100_000, a.drift_preview, spot, a)
        log(f"drift prediction: {json.dumps(pred)}")
        dropped_at: list[int] = []

        async def stop(job: Job, done: list[Job]) -> bool:
            if job.spot_fa and await self.policy_mode() == "shadow":
                dropped_at.append(len(done))
                return True
            return False

        jobs = await self.jobs(drift, a.drift_max, stop)
        jobs.sort(key=lambda j: j.index)
        upto = dropped_at[0] if dropped_at else len(jobs)
        before = jobs[:upto]
        auto_all = [j for j in on_jobs + before if j.auto]
        fa_all = sum(1 for j in auto_all if not j.verdict.get("unchanged"))
        r = policy["promise"]
        return {
            "prediction": pred,
            "dropped": bool(dropped_at),
            "jobs_to_drop": dropped_at[0] if dropped_at else None,
            "drift_jobs_run": len(jobs),
            "drift_auto_approved": sum(1 for j in before if j.auto),
            "drift_false_accepts": sum(1 for j in before if j.auto and not j.verdict.get("unchanged")),
            "drift_spot_checks": sum(1 for j in before if j.spot),
            "drift_spot_false_accepts": sum(1 for j in before if j.spot_fa),
            "on_period_auto_approved": len(auto_all),
            "on_period_false_accepts": fa_all,
            "on_period_false_accept_rate": fa_all / len(auto_all) if auto_all else 0.0,
            "exceeded_twice_promise": bool(auto_all) and fa_all / len(auto_all) > 2 * r,
            "mode_after": await self.policy_mode() if self.up else None,
        }


# --------------------------------------------------------------------------- the table


def table(out: dict[str, Any]) -> str:
    lines = [
        "| reviewed jobs | policy (tightest promise written) | held-out evidence | tightest bound the evidence "
        "allows | the same without the detector's evidence | fresh jobs approved automatically | their false "
        "accepts (truth), 95 % upper bound | person-min / 1,000 images before → after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in out["checkpoints"]:
        written = [f for f in p["fits"] if f["written"]]
        bound = min(f["bound"] for f in p["fits"])
        refused = ", ".join(f"R={f['promise']} refused" for f in p["fits"] if not f["written"])
        if written:
            best = min(written, key=lambda f: f["promise"])
            ev = best["evidence"]
            pol = f"R={best['promise']}, threshold {best['threshold']:.3f}" + (f" ({refused})" if refused else "")
            pol += ", reads the evidence" if best.get("reads_evidence") else ", features only"
            evid = f"{ev['heldout_false_accepts']} of {ev['heldout_approved']} approved ({ev['approve_share']:.1%})"
        else:
            pol, evid = (
                f"none ({refused})",
                f"cleanest threshold: {max(f['clean_approved'] for f in p['fits'])} approved",
            )
        fr = p.get("fresh")
        if fr:
            lo, hi = fr["auto_share_ci"]
            share = f"{fr['auto_approved']} of {fr['jobs']} ({fr['auto_share']:.1%}, 95 % CI {lo:.1%}–{hi:.1%})"
            fa = f"{fr['false_accepts']} ({fr['false_accept_rate']:.2%}), ≤ {fr['false_accept_upper']:.2%}"
            pm = f"{fr['person_min_per_1000_before']:.0f} → {fr['person_min_per_1000_after']:.0f}"
        else:
            share = fa = pm = "–"
        lines.append(f"| {p['dataset_rows']} | {pol} | {evid} | {bound:.2%} | {ablation(p)} | {share} | {fa} | {pm} |")
    d = out.get("drift")
    if d and "prediction" in d:
        pr = d["prediction"]
        lines.append("")
        measured = (
            f"dropped after {d['jobs_to_drop']} jobs" if d["dropped"] else f"no drop in {d['drift_jobs_run']} jobs"
        )
        side = "above" if d["exceeded_twice_promise"] else "within"
        lines.append(
            f"drift: predicted drop after ~{pr['jobs_predicted'] or float('nan'):.0f} jobs "
            f"({pr['spot_checks_needed']} spot checks; the policy would approve {pr['would_approve_share']:.1%} "
            f"of the new domain, {pr['false_accept_share_of_approved']:.1%} of them wrongly); measured: {measured}, "
            f"{d['drift_false_accepts']} false accepts approved in the drift before it; whole on-period "
            f"{d['on_period_false_accepts']} of {d['on_period_auto_approved']} "
            f"({d['on_period_false_accept_rate']:.2%}), {side} 2x the promise"
        )
    elif d:
        lines.append(f"drift: {d}")
    return "\n".join(lines)


def ablation(point: dict[str, Any]) -> str:
    """The checkpoint's fits on its data set with the evidence taken off: the tightest written, or none."""
    fits = point.get("fits_without_evidence") or []
    if not fits:
        return "not run"
    written = [f for f in fits if f["written"]]
    if not written:
        return f"none written (bound at best {min(f['bound'] for f in fits):.2%})"
    best = min(written, key=lambda f: f["promise"])
    ev = best["evidence"]
    return f"R={best['promise']}: {ev['heldout_false_accepts']} of {ev['heldout_approved']} ({ev['approve_share']:.1%})"


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default="500,1000,2000,5000", help="reviewed-job counts to fit at")
    ap.add_argument("--promises", default="0.005,0.02,0.05", help="--max-false-accept values tried at each")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--spot-check", type=float, default=0.05, help="hitl up --spot-check (default 0.05)")
    ap.add_argument("--fresh", type=int, default=300, help="fresh jobs measured per policy written")
    splits = ", ".join(getattr(cutout_data, "ALL_SPLITS", cutout_data.SPLITS))
    ap.add_argument("--domain", default="easy", help=f"the shop's cutout_data split ({splits})")
    ap.add_argument("--drift-domain", default="new", help="the split the stream switches to")
    ap.add_argument("--drift-max", type=int, default=500, help="most drift jobs (0: no drift phase)")
    ap.add_argument("--drift-preview", type=int, default=200, help="drift images for the prediction")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--keep-iou", type=float, default=0.7, help="a detection kept as it is at IoU >= this")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--page-s", type=float, default=3.55, help="measured page time per review (docs/benchmarks.md)")
    ap.add_argument("--look-s", type=float, default=10.0, help="assumed judging time per review")
    ap.add_argument("--edit-s", type=float, default=5.0, help="assumed time per box moved, deleted or drawn")
    ap.add_argument("--hitl-arg", action="append", help="one more hitl up argument (repeat)")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", default="benchmarks/out/learning_loop.json")
    args = ap.parse_args()
    args.checkpoints = sorted(int(x) for x in floats(args.checkpoints))
    args.promises = sorted(floats(args.promises))
    args.run_id = f"{time.time_ns():x}"
    t0 = time.monotonic()
    out = asyncio.run(Loop(args).run())
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print()
    print(table(out))
    print(
        f"\nperson-time per review: {args.page_s} s page (measured) + {args.look_s} s judging + {args.edit_s} s "
        f"per edit (assumed); domain {args.domain}, drift {args.drift_domain}, spot check {args.spot_check}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.json} ({out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
