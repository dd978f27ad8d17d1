"""``hitl export`` (docs/archive.md § Export): archived jobs with real mask PNGs in a real artifact
store, exported as COCO (loaded back with pycocotools) and as YOLO, with the reviewer's corrections
to the detector's proposals apart from the approved labels."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from hitl_review.archive import migrate
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.cli import add_export_command
from hitl_review.archive.db import Archive
from hitl_review.archive.export import main as export_main
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef

from .test_archive import finished_job

W, H = 640, 480


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _mask(i: int, job: int) -> np.ndarray:
    """A different shape per box and job: a rectangle, then a disk (so RLE has several runs per column)."""
    m = np.zeros((H, W), dtype=np.uint8)
    if i % 2 == 0:
        m[20 + 10 * job : 80 + 7 * i, 30 : 90 + 13 * i + job] = 255
    else:
        yy, xx = np.mgrid[:H, :W]
        m[(yy - 240) ** 2 + (xx - 320 - job) ** 2 <= (40 + 5 * i) ** 2] = 255
    return m


@pytest.fixture
async def exported_world(store, tmp_path: Path):
    """Three finished, archived jobs: two from batch ``spring``, one from ``autumn``; each box's
    mask is a real PNG in the artifact store. Returns the paths and the masks by job."""
    artifacts = ArtifactStore(f"file://{tmp_path / 'artifacts'}")
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    archive = Archive(url)
    masks: dict[str, list[np.ndarray]] = {}
    try:
        for n, batch in enumerate(("spring", "spring", "autumn")):
            photo = np.full((H, W, 3), 40 * n, dtype=np.uint8)
            name = artifacts.put("image", _png(photo), "png")
            image = ImageRef(sha256=f"{n:064x}", width=W, height=H, url=ArtifactStore.url(name))
            arrays = [_mask(i, n) for i in range(3)]
            names = {i: artifacts.put("mask", _png(a), "png") for i, a in enumerate(arrays)}
            job_id = await finished_job(store, image, masks=names, key=f"{batch}:{n:064x}", gated=True)
            assert await archive_job(store, archive, job_id) == "INSERTED"
            masks[job_id] = arrays
    finally:
        archive.close()
    return {"url": url, "artifacts": str(tmp_path / "artifacts"), "masks": masks, "tmp": tmp_path}


def _export(world, fmt: str, out: Path, *extra: str) -> None:
    argv = ["--format", fmt, "--out", str(out), "--archive-url", world["url"], "--artifacts", world["artifacts"]]
    assert export_main([*argv, *extra]) == 0


async def test_coco_export_loads_in_pycocotools_with_the_jobs_boxes_and_mask_areas(exported_world, capsys):
    out = exported_world["tmp"] / "coco"
    _export(exported_world, "coco", out, "--batch", "spring", "--since", "2020-01-01")
    assert "2 images, 6 boxes, 6 masks" in capsys.readouterr().out
    coco = COCO(str(out / "annotations.json"))
    assert len(coco.getImgIds()) == 2 and len(coco.getAnnIds()) == 6
    assert {c["name"] for c in coco.loadCats(coco.getCatIds())} == {"shoe", "bag"}
    masks = exported_world["masks"]
    spring = list(masks)[:2]
    for img in coco.loadImgs(coco.getImgIds()):
        job_id = img["hitl_job_id"]
        assert job_id in spring
        assert (img["width"], img["height"]) == (W, H)
        assert (out / img["file_name"]).exists()
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img["id"]]))
        assert len(anns) == 3
        for ann, expected in zip(anns, masks[job_id], strict=True):
            truth = expected > 0
            assert ann["area"] == int(truth.sum())
            assert np.array_equal(coco.annToMask(ann).astype(bool), truth)
        # The approved boxes, as the reviewer left them: box 0 moved 5 px right.
        assert [a["bbox"] for a in anns][0] == [15.0, 10.0, 90.0, 110.0]
        # The quality gate's word on each mask and who let it through (none on the third: no gate ran).
        assert [a.get("hitl_quality", {}).get("verdict") for a in anns] == ["PASS", "FAIL", None]
        assert anns[0]["hitl_quality"]["scores"] == {"fill": 0.6} and anns[0]["hitl_decided_by"] == "gate"
        assert anns[1]["hitl_refinements"] == ["enlarged_box"] and anns[1]["hitl_decided_by"] is None
    corrections = json.loads((out / "corrections.json").read_text())
    assert corrections["totals"] == {"added": 2, "moved": 2, "relabelled": 0, "deleted": 2}
    job = corrections["jobs"][0]
    assert (job["proposed"], job["approved"]) == (3, 3)
    assert [b["label"] for b in job["added"]] == ["bag"] and [b["label"] for b in job["deleted"]] == ["hand"]
    assert job["moved"][0]["from"] == [10.0, 10.0, 100.0, 120.0] and job["moved"][0]["to"] == [15.0, 10.0, 105.0, 120.0]


async def test_coco_export_since_a_later_date_is_empty(exported_world):
    out = exported_world["tmp"] / "none"
    _export(exported_world, "coco", out, "--since", "2999-01-01")
    assert json.loads((out / "annotations.json").read_text())["images"] == []
    with pytest.raises(SystemExit):
        export_main(["--format", "coco", "--out", str(out), "--since", "last tuesday"])


def test_export_from_no_archive_or_an_unmigrated_one_says_so(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert export_main(["--format", "coco", "--out", out, "--data-dir", str(tmp_path)]) == 1
    assert "no archive at" in capsys.readouterr().err
    assert not (tmp_path / "archive.sqlite3").exists()  # a read creates nothing
    Archive(f"sqlite:///{tmp_path / 'archive.sqlite3'}").engine.connect().close()  # an empty database file
    assert export_main(["--format", "coco", "--out", out, "--data-dir", str(tmp_path)]) == 1
    assert "archive-upgrade" in capsys.readouterr().err


async def test_hitl_export_as_a_subcommand_of_a_parser_like_hitls(exported_world):
    """What serve_app/cli.py adds: ``add_export_command(sub)`` on its subparsers, run by ``args.func``."""
    parser = argparse.ArgumentParser(prog="hitl")
    sub = parser.add_subparsers(dest="command")
    add_export_command(sub)
    out = exported_world["tmp"] / "sub"
    args = parser.parse_args(
        ["export", "--format", "yolo", "--out", str(out), "--archive-url", exported_world["url"]]
        + ["--artifacts", exported_world["artifacts"], "--batch", "autumn", "--since", "2026-01-01T00:00:00Z"]
    )
    assert args.func(args) == 0
    assert len(list((out / "labels").glob("*.txt"))) == 1


async def test_yolo_export_writes_normalized_labels_masks_and_names(exported_world):
    out = exported_world["tmp"] / "yolo"
    _export(exported_world, "yolo", out)
    labels = sorted((out / "labels").glob("*.txt"))
    assert len(labels) == 3 and len(list((out / "images").glob("*.png"))) == 3
    assert len(list((out / "masks").glob("*.png"))) == 9
    names = (out / "data.yaml").read_text()
    assert '0: "bag"' in names and '1: "shoe"' in names
    for path in labels:
        rows = [line.split() for line in path.read_text().splitlines()]
        assert len(rows) == 3
        # Moved box 0 (shoe) [15, 10, 105, 120]; kept box 1 (shoe) [200, 40, 320, 200]; drawn bag [500, 300, 600, 400].
        assert rows[0] == ["1", f"{60 / W:.6f}", f"{65 / H:.6f}", f"{90 / W:.6f}", f"{110 / H:.6f}"]
        assert rows[1] == ["1", f"{260 / W:.6f}", f"{120 / H:.6f}", f"{120 / W:.6f}", f"{160 / H:.6f}"]
        assert rows[2] == ["0", f"{550 / W:.6f}", f"{350 / H:.6f}", f"{100 / W:.6f}", f"{100 / H:.6f}"]
    job_id = labels[0].stem
    first = np.asarray(Image.open(out / "masks" / f"{job_id}_{_box_ids(out, job_id)[0]}.png")) > 0
    assert np.array_equal(first, exported_world["masks"][job_id][0] > 0)


def _box_ids(out: Path, job_id: str) -> list[str]:
    corrections = json.loads((out / "corrections.json").read_text())
    job = next(j for j in corrections["jobs"] if j["job_id"] == job_id)
    return [m["box_id"] for m in job["moved"]]


def _without_location_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HITL_DATA_DIR", "HITL_ARTIFACTS", "HITL_ARCHIVE_URL"):
        monkeypatch.delenv(name, raising=False)


async def test_export_finds_the_archive_and_artifacts_by_hitl_data_dir_and_hitl_artifacts(
    exported_world, monkeypatch, capsys
):
    """The fixture's layout is a data directory's: HITL_DATA_DIR alone finds the archive and the
    artifacts; artifacts moved elsewhere are found by HITL_ARTIFACTS."""
    _without_location_env(monkeypatch)
    tmp = exported_world["tmp"]
    monkeypatch.setenv("HITL_DATA_DIR", str(tmp))
    assert export_main(["--format", "yolo", "--out", str(tmp / "by-env")]) == 0
    assert "3 images, 9 boxes, 9 masks" in capsys.readouterr().out
    (tmp / "artifacts").rename(tmp / "moved")
    monkeypatch.setenv("HITL_ARTIFACTS", f"file://{tmp / 'moved'}")
    assert export_main(["--format", "coco", "--out", str(tmp / "by-env-2")]) == 0
    assert "3 images, 9 boxes, 9 masks" in capsys.readouterr().out


async def test_export_with_masks_missing_exits_non_zero_in_one_line(exported_world, monkeypatch, capsys):
    """A training set without its masks is a failure (exit 1, one line saying what and what to do),
    not a warning per mask; --allow-missing accepts it."""
    _without_location_env(monkeypatch)
    tmp = exported_world["tmp"]
    empty = tmp / "empty-store"
    empty.mkdir()
    argv = ["--format", "coco", "--archive-url", exported_world["url"], "--artifacts", str(empty)]
    assert export_main([*argv, "--out", str(tmp / "a")]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert "9 of 9 masks" in err and "3 of 3 images" in err and "--artifacts" in err and "--allow-missing" in err
    assert "0 masks" in captured.out  # what was written is still said
    assert export_main([*argv, "--out", str(tmp / "b"), "--allow-missing"]) == 0
    assert "9 of 9 masks" in capsys.readouterr().err


async def test_export_json_summary(exported_world, monkeypatch, capsys):
    _without_location_env(monkeypatch)
    tmp_path = exported_world["tmp"] / "elsewhere"  # no archive, no artifacts
    tmp_path.mkdir()
    out = exported_world["tmp"] / "json"
    _export(exported_world, "yolo", out, "--json", "--batch", "spring")
    body = json.loads(capsys.readouterr().out)
    assert body["format"] == "yolo" and body["out"] == str(out)
    assert (body["images"], body["annotations"], body["masks"]) == (2, 6, 6)
    assert body["labels"] == ["bag", "shoe"] and body["missing"] == {"images": [], "masks": []}
    # Errors are JSON on stdout too, and the exit status says them.
    assert export_main(["--format", "coco", "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path), "--json"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "ARCHIVE_NOT_READY" and "no archive at" in error["message"]
    argv = ["--format", "coco", "--archive-url", exported_world["url"], "--artifacts", str(tmp_path), "--json"]
    assert export_main([*argv, "--out", str(tmp_path / "p")]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["error"]["code"] == "ARTIFACTS_MISSING" and len(body["missing"]["masks"]) == 9


def _split(out: Path) -> dict[str, set[str]]:
    return {s: {p.stem for p in (out / "images" / s).iterdir()} for s in ("train", "val")}


async def test_yolo_segmentation_export_reads_back_in_supervision_with_real_splits(exported_world):
    """Polygons from the masks (OpenCV contours), a data.yaml with disjoint, non-empty train and val
    splits by job id, read back by supervision's YOLO loader: every mask within a few % of the truth."""
    import supervision as sv
    import yaml

    out = exported_world["tmp"] / "yolo-seg"
    _export(exported_world, "yolo-seg", out)
    data = yaml.safe_load((out / "data.yaml").read_text())
    assert (data["train"], data["val"]) == ("images/train", "images/val")
    assert sorted(data["names"].values()) == ["bag", "shoe"]
    split = _split(out)
    masks = exported_world["masks"]
    assert split["train"] and split["val"] and not split["train"] & split["val"]
    assert split["train"] | split["val"] == set(masks)
    again = exported_world["tmp"] / "yolo-seg-again"
    _export(exported_world, "yolo-seg", again)
    assert _split(again) == split  # deterministic: by the job id's hash
    seen = 0
    for s in ("train", "val"):
        ds = sv.DetectionDataset.from_yolo(
            str(out / "images" / s), str(out / "labels" / s), str(out / "data.yaml"), force_masks=True
        )
        assert sorted(ds.classes) == ["bag", "shoe"]
        for path, _image, det in ds:
            truth = [m > 0 for m in masks[Path(path).stem]]
            assert len(det) == 3 and det.mask is not None
            for got, expected in zip(det.mask, truth, strict=True):
                iou = (got & expected).sum() / (got | expected).sum()
                assert iou > 0.95, iou
            seen += 1
    assert seen == 3


async def test_pascal_voc_export_reads_back_in_supervision_with_the_approved_boxes(exported_world):
    import supervision as sv

    out = exported_world["tmp"] / "voc"
    _export(exported_world, "voc", out, "--batch", "spring")
    ds = sv.DetectionDataset.from_pascal_voc(str(out / "JPEGImages"), str(out / "Annotations"))
    assert len(ds) == 2 and sorted(ds.classes) == ["bag", "shoe"]
    for _path, _image, det in ds:
        assert len(det) == 3
        assert det.xyxy[0].tolist() == [15.0, 10.0, 105.0, 120.0]  # the approved box, box 0 moved 5 px right
    sets = out / "ImageSets" / "Main"
    ids = (sets / "train.txt").read_text().split() + (sets / "val.txt").read_text().split()
    assert sorted(ids) == sorted(p.stem for p in (out / "Annotations").iterdir())
