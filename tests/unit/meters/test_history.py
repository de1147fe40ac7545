"""The CUDA allocator history through a fake ``torch.cuda.memory``: what it records, saves and reads of sites."""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_vramleak.meters.history import AllocatorHistory, BlockSites

from ...fakes import FakeMemory

TORCH_FILE = sys.modules["torch"].__file__ or ""


class Storage:
    def __init__(self, pointer: int) -> None:
        self.pointer = pointer

    def data_ptr(self) -> int:
        return self.pointer


def test_block_sites_keep_the_users_frames_of_live_blocks() -> None:
    snapshot = {
        "segments": [
            {
                "device": 0,
                "blocks": [
                    {
                        "address": 4096,
                        "state": "active_allocated",
                        "frames": [
                            {"filename": TORCH_FILE, "line": 10, "name": "backward"},
                            {"filename": "/work/data/featurize.py", "line": 88, "name": "embed"},
                            {"filename": "/work/tests/test_train.py", "line": 41, "name": "test_train"},
                        ],
                    },
                    {
                        "address": 8192,
                        "state": "inactive",
                        "frames": [{"filename": "/work/x.py", "line": 1, "name": "f"}],
                    },
                ],
            },
            {"device": 1, "blocks": [{"address": 4096, "state": "active_allocated", "frames": []}]},
        ]
    }
    sites = BlockSites.from_snapshot(snapshot, device_index=0)
    assert sites.site_of(None, Storage(4096)) == (
        ("/work/data/featurize.py", 88, "embed"),
        ("/work/tests/test_train.py", 41, "test_train"),
    )
    assert sites.site_of(None, Storage(8192)) is None


def test_history_records_only_while_asked(tmp_path: Path) -> None:
    memory = FakeMemory()
    history = AllocatorHistory(memory, 0)
    history.start()
    saved = history.save(tmp_path, "tests/test_x.py::test_leaks[case 1]")
    history.stop()
    history.stop()
    assert memory.calls == ["all", None]
    assert saved == tmp_path / "tests_test_x.py_test_leaks_case_1.pickle"
    assert saved.read_bytes() == b"snapshot"
