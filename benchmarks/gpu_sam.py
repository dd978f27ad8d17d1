#!/usr/bin/env python
"""Segment Anything throughput through the project's own backend code.

Times exactly what the deployments run: ``SamEncoder.embed_batch`` (the ``@serve.batch``
path of the Segmenter / BoxValidator), ``SamModel.predict_boxes`` (all box prompts of an
image in one decoder call), ``SamSegmenter.segment`` and one VALIDATE -> PROCESS node pair
through ``deployments.executor.run_node``. Weights are random (no download); the
architectures are the released ViT-B and ViT-H (``--tiny``: the small test model).

    python benchmarks/gpu_sam.py --device cuda --json benchmarks/out/gpu_sam.json
    python benchmarks/gpu_sam.py --device cpu --tiny --json /tmp/gpu_sam.json   # CI smoke, < 60 s

Needs torch, torchvision, segment_anything and numpy; not Ray. Without OpenCV the mask
clean-up (and so the segment and node rows) is skipped, without fsspec the node rows
use an in-memory artifact store. A time budget (``--budget-s``) skips what no longer
fits, compiled variants last, and says so in the output.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import hashlib
import importlib
import io
import itertools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hitl_review.deployments.backends import sam as S


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


HAVE_CV2 = _importable("cv2")
HAVE_FSSPEC = _importable("fsspec")

VARIANTS: dict[str, dict[str, Any]] = {  # name: SamModel settings
    "fp32": {"precision": "fp32", "sdpa": False, "compile": False},
    "bf16+sdpa": {"precision": "bf16", "sdpa": True, "compile": False},
    "fp32+compile": {"precision": "fp32", "sdpa": False, "compile": True},
    "bf16+sdpa+compile": {"precision": "bf16", "sdpa": True, "compile": True},
}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


class MemoryStore:
    """The ArtifactStore interface in a dict, for machines without fsspec."""

    root = "memory://"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, kind: str, data: bytes, ext: str) -> str:
        name = f"{kind}_{hashlib.sha256(data).hexdigest()[:32]}.{ext}"
        self.blobs[name] = data
        return name

    def put_named(self, name: str, data: bytes) -> str:
        self.blobs[name] = data
        return name

    def exists(self, name: str) -> bool:
        return name in self.blobs

    def get(self, name: str) -> bytes:
        if name not in self.blobs:
            raise FileNotFoundError(name)
        return self.blobs[name]

    @staticmethod
    def url(name: str) -> str:
        return f"/api/v1/artifacts/{name}"


def product_image(h: int = 768, w: int = 1024, seed: int = 0) -> np.ndarray:
    """A studio-like product shot in numpy alone: light gradient, an ellipse, a box, noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.empty((h, w, 3), np.float32)
    img[:] = 236.0
    img += (yy / h * 16 - 8)[..., None]
    shoe = ((xx - 0.3 * w) / (0.18 * w)) ** 2 + ((yy - 0.6 * h) / (0.12 * h)) ** 2 <= 1
    box = (xx > 0.6 * w) & (xx < 0.85 * w) & (yy > 0.25 * h) & (yy < 0.8 * h)
    img[shoe] = (170, 40, 40)
    img[box] = (40, 90, 170)
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def subject_boxes(h: int, w: int, n: int) -> np.ndarray:
    """``n`` plausible boxes spread over the image (xyxy pixels)."""
    rng = np.random.default_rng(n)
    x1 = rng.uniform(0, 0.6 * w, n)
    y1 = rng.uniform(0, 0.6 * h, n)
    return (
        np.stack([x1, y1, x1 + rng.uniform(0.15, 0.4, n) * w, y1 + rng.uniform(0.15, 0.4, n) * h], 1)
        .clip(0, [w, h, w, h])
        .astype(np.float32)
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds of ``iters`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
        sync(device)
    samples = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def row(
    kind: str, model: str, variant: str, n: int, seconds: float | None, unit: str, note: str = "", **extra: Any
) -> dict[str, Any]:
    per_s = (n / seconds) if seconds else None
    return {
        "kind": kind,
        "model": model,
        "variant": variant,
        "n": n,
        "ms": None if seconds is None else round(seconds * 1000, 2),
        "per_s": None if per_s is None else round(per_s, 2),
        "unit": unit,
        "note": note,
        **extra,
    }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = S.resolve_device(args.device)
        self.budget = Budget(args.budget_s)
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.image = product_image(*((384, 512) if args.tiny else (768, 1024)))
        self.ids = itertools.count()
        self.models: dict[str, Any] = {}

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(f"{what}: {why}")

    def fits(self, what: str, need_s: float) -> bool:
        if self.budget.left() < need_s:
            self.skip(what, f"time budget ({self.budget.left():.0f}s left, ~{need_s:.0f}s needed)")
            return False
        return True

    def build(self, model_type: str, variant: str, base: torch.nn.Module) -> S.SamModel:
        """The variant's SamModel on a copy of the same random weights (SDPA patches in place)."""
        cfg = VARIANTS[variant]
        return S.SamModel(copy.deepcopy(base), model_type, f"{model_type}:bench", device=str(self.device), **cfg)

    def encoder_rows(self, model_type: str, variant: str, model: S.SamModel) -> S.SamEncoder | None:
        enc = S.SamEncoder(model, artifacts=None, cache_size=1)
        for b in self.args.batches:
            what = f"encoder {model_type} {variant} batch {b}"
            if not self.fits(what, self.args.min_step_s):
                continue
            images = [self.image] * b
            try:
                t_pre = time_it(functools.partial(model.preprocess, images), self.device, 1, 1)
                t = time_it(
                    # fresh image keys on every call, so no call hits the embedding cache; timed at once
                    lambda: enc.embed_batch(images, [f"img-{next(self.ids)}" for _ in images]),  # noqa: B023 - runs at once, in this iteration
                    self.device,
                    self.args.warmup,
                    self.args.iters,
                )
            except torch.cuda.OutOfMemoryError:
                self.skip(what, "CUDA out of memory")
                free(self.device)
                break
            self.add(
                row(
                    "encoder",
                    model_type,
                    variant,
                    b,
                    t,
                    "img/s",
                    encoder_only_per_s=round(b / max(t - t_pre, 1e-9), 2),
                    preprocess_ms=round(t_pre * 1000, 2),
                )
            )
        return enc

    def decoder_rows(self, model_type: str, variant: str, enc: S.SamEncoder) -> None:
        h, w = self.image.shape[:2]
        emb = enc.embed(self.image, "decoder-image")
        seg = S.SamSegmenter(encoder=enc) if HAVE_CV2 else None
        for n in (1, 4, 16):
            if not self.fits(f"decoder {model_type} {n} boxes", 5):
                return
            boxes = subject_boxes(h, w, n)
            t = time_it(
                functools.partial(enc.model.predict_boxes, emb, boxes), self.device, self.args.warmup, self.args.iters
            )
            self.add(row("decoder", model_type, variant, n, t, "boxes/s"))
            if seg is None:
                self.skip(f"segment {model_type} {n} boxes", "OpenCV not installed (mask clean-up)")
                continue
            items = [{"box_id": f"b{i}", "bbox": b.tolist()} for i, b in enumerate(boxes)]
            t = time_it(
                functools.partial(seg.segment, self.image, "decoder-image", items), self.device, 1, self.args.iters
            )
            self.add(
                row("segment", model_type, variant, n, t, "boxes/s", note="decoder + clip + largest component + holes")
            )

    def node_rows(self, model_type: str, variant: str, enc: S.SamEncoder) -> None:
        """VALIDATE (cold: the encoder runs) then PROCESS (warm: the embedding is reused) on one image."""
        if not HAVE_CV2:
            self.skip(f"nodes {model_type}", "OpenCV not installed (mask clean-up)")
            return
        if not self.fits(f"nodes {model_type}", self.args.min_step_s):
            return
        from PIL import Image

        from hitl_review.deployments.executor import Models, run_node

        tmp = None
        if HAVE_FSSPEC:
            from hitl_review.statecore.artifacts import ArtifactStore

            tmp = tempfile.TemporaryDirectory(prefix="gpu_sam_")
            store: Any = ArtifactStore(f"file://{tmp.name}/artifacts")
        else:
            store = MemoryStore()
        buf = io.BytesIO()
        Image.fromarray(self.image).save(buf, "PNG")
        name = store.put("img", buf.getvalue(), "png")
        h, w = self.image.shape[:2]
        models = Models(validator=S.SamValidator(encoder=enc, threshold=0.5), segmenter=S.SamSegmenter(encoder=enc))
        boxes = [
            {"box_id": f"box_{i}", "bbox": b.tolist(), "label": None, "source": "manual"}
            for i, b in enumerate(subject_boxes(h, w, 4))
        ]
        validate_s, process_s = [], []
        for i in range(self.args.warmup + self.args.iters):
            ref = {"sha256": f"node-{next(self.ids)}", "width": w, "height": h, "url": store.url(name)}
            sync(self.device)
            t0 = time.perf_counter()
            run_node("VALIDATE_MANUAL_BOX_LIST", {"image": ref, "items_to_validate": boxes}, models, store)
            sync(self.device)
            t1 = time.perf_counter()
            run_node("PROCESS_APPROVED_BOX_LIST", {"image": ref, "approved_box_list": boxes}, models, store)
            sync(self.device)
            t2 = time.perf_counter()
            if i >= self.args.warmup:
                validate_s.append(t1 - t0)
                process_s.append(t2 - t1)
        v, p = statistics.median(validate_s), statistics.median(process_s)
        store_kind = "ArtifactStore(file)" if tmp else "in-memory store"
        for seconds, note in (
            (v, f"VALIDATE_MANUAL_BOX_LIST, cold embedding, {store_kind}"),
            (p, f"PROCESS_APPROVED_BOX_LIST, warm embedding, PNGs to {store_kind}"),
            (v + p, "validate -> segment total"),
        ):
            self.add(row("node", model_type, variant, 4, seconds, "boxes/s", note=note))
        if tmp:
            tmp.cleanup()

    def add(self, r: dict[str, Any]) -> None:
        self.rows.append(r)
        self.print_row(r)

    @staticmethod
    def print_header() -> None:
        print(f"{'kind':8} {'model':9} {'variant':18} {'n':>3} {'ms':>10} {'per s':>10}  {'unit':7} note", flush=True)

    @staticmethod
    def print_row(r: dict[str, Any]) -> None:
        ms = "-" if r["ms"] is None else f"{r['ms']:.1f}"
        per = "-" if r["per_s"] is None else f"{r['per_s']:.2f}"
        note = r["note"]
        if r["kind"] == "encoder":
            note = f"encoder only {r['encoder_only_per_s']:.2f} img/s, preprocess {r['preprocess_ms']:.1f} ms"
        print(
            f"{r['kind']:8} {r['model']:9} {r['variant']:18} {r['n']:>3} {ms:>10} {per:>10}  {r['unit']:7} {note}",
            flush=True,
        )

    def run(self) -> dict[str, Any]:
        a = self.args
        model_types = a.models or (["vit_tiny"] if a.tiny else ["vit_b", "vit_h"])
        eager = ["fp32", "bf16+sdpa"]
        compiled = ["fp32+compile", "bf16+sdpa+compile"] if self.device.type == "cuda" and not a.no_compile else []
        if self.device.type != "cuda":
            self.skip("compile variants", "CPU run")
        default_variant = "bf16+sdpa" if self.device.type == "cuda" else "fp32"  # what precision=auto picks
        print(
            f"device {self.device} ({device_name(self.device)}), image {self.image.shape[1]}x{self.image.shape[0]}, "
            f"batches {a.batches}, warmup {a.warmup}, iters {a.iters}, budget {a.budget_s:.0f}s",
            flush=True,
        )
        self.print_header()
        bases: dict[str, torch.nn.Module] = {}
        for mt in model_types:
            if not self.fits(f"model {mt}", a.min_step_s):
                continue
            torch.manual_seed(0)
            t0 = time.perf_counter()
            with torch.device(self.device):  # initialise on the device: seconds, not minutes, for ViT-H
                bases[mt] = S.SAM_BUILDERS[mt]().eval()
            self.models[mt] = {
                "params_m": round(sum(p.numel() for p in bases[mt].parameters()) / 1e6, 2),
                "encoder_params_m": round(
                    sum(p.numel() for p in bases[mt].get_submodule("image_encoder").parameters()) / 1e6, 2
                ),
                "build_s": round(time.perf_counter() - t0, 2),
            }
            for variant in eager:
                model = self.build(mt, variant, bases[mt])
                enc = self.encoder_rows(mt, variant, model)
                if variant == default_variant and enc is not None:
                    self.decoder_rows(mt, variant, enc)
                    self.node_rows(mt, variant, enc)
                del model, enc
                free(self.device)
        for mt in list(bases):
            for variant in compiled:
                if not self.fits(f"encoder {mt} {variant}", a.compile_need_s * (4 if mt == "vit_h" else 1)):
                    continue
                model = self.build(mt, variant, bases[mt])
                self.encoder_rows(mt, variant, model)
                del model
                free(self.device)
            del bases[mt]
            free(self.device)
        return {
            "benchmark": "gpu_sam",
            "device": str(self.device),
            "device_name": device_name(self.device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "image_hw": list(self.image.shape[:2]),
            "batches": a.batches,
            "warmup": a.warmup,
            "iters": a.iters,
            "budget_s": a.budget_s,
            "opencv": HAVE_CV2,
            "fsspec": HAVE_FSSPEC,
            "models": self.models,
            "rows": self.rows,
            "skipped": self.skipped,
            "wall_s": round(time.monotonic() - self.budget.t0, 1),
        }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="the small test architecture instead of ViT-B and ViT-H")
    p.add_argument("--models", nargs="*", choices=sorted(S.SAM_BUILDERS), help="override the model list")
    p.add_argument(
        "--batches",
        type=int,
        nargs="*",
        default=None,
        help="encoder batch sizes (default 1 4 8 16 on CUDA, 1 2 on CPU)",
    )
    p.add_argument("--warmup", type=int, default=None, help="default 2 on CUDA, 1 on CPU")
    p.add_argument("--iters", type=int, default=None, help="timed iterations (median); default 3 on CUDA, 1 on CPU")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new measurements after this many seconds (default 480 CUDA, 50 CPU)",
    )
    p.add_argument("--min-step-s", type=float, default=None, help="time one measurement step is assumed to need")
    p.add_argument("--compile-need-s", type=float, default=60.0, help="time a ViT-B compile variant is assumed to need")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    args.batches = args.batches or ([1, 4, 8, 16] if cuda else [1, 2])
    if args.warmup is None:
        args.warmup = 2 if cuda else 1
    args.iters = args.iters or (3 if cuda else 1)
    args.budget_s = args.budget_s or (480.0 if cuda else 50.0)
    args.min_step_s = args.min_step_s or (15.0 if cuda else 3.0)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    result = Bench(args).run()
    for what in result["skipped"]:
        print(f"skipped {what}")
    print(f"done in {result['wall_s']}s; {len(result['rows'])} rows, {len(result['skipped'])} skipped", flush=True)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
