"""The artifact store on a real local disk: same-content puts racing from many threads all succeed,
and a reader never sees a partly written file."""

from __future__ import annotations

import os
import threading

from hitl_review.statecore.artifacts import ArtifactStore


def test_concurrent_puts_of_the_same_image_all_succeed_and_readers_see_whole_files(tmp_path):
    store = ArtifactStore(f"file://{tmp_path}/artifacts")
    data = os.urandom(4 * 1024 * 1024)
    name = ArtifactStore.name_for("image", data, "png")
    errors: list[BaseException] = []
    partial: list[int] = []
    start = threading.Barrier(17)
    done = threading.Event()

    def writer() -> None:
        start.wait()
        try:
            for _ in range(5):
                assert store.put("image", data, "png") == name
                store.put_named(name, data)  # the overwrite path races the same way
        except BaseException as e:
            errors.append(e)

    def reader() -> None:
        start.wait()
        while not done.is_set():
            if store.exists(name):
                got = store.get(name)
                if got != data:
                    partial.append(len(got))

    writers = [threading.Thread(target=writer) for _ in range(16)]
    r = threading.Thread(target=reader)
    for t in [*writers, r]:
        t.start()
    for t in writers:
        t.join()
    done.set()
    r.join()
    assert errors == []
    assert partial == [], f"a reader saw {len(partial)} partial files"
    assert store.get(name) == data
    leftovers = [p for p in os.listdir(tmp_path / "artifacts") if p != name]
    assert leftovers == [], leftovers  # no temporary file is left behind
