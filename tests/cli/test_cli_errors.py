"""``lerobot-nodes`` errors are one ``error:`` line (plus a hint), with the traceback only on request."""

from __future__ import annotations

import ctypes
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, IterableDataset

from lerobot_nodes.cli.console import error_message
from lerobot_nodes.errors import MetadataError, SourceFileNotFoundError, VideoDecodeError

from .cli_process import assert_one_line_error, run_cli

DEBUG_HINT = "hint: --debug (or LEROBOT_NODES_DEBUG=1) prints the full traceback"


def test_missing_dataset_root(tmp_path: Path) -> None:
    result = run_cli("stream", f"--dataset.root={tmp_path / 'absent'}", "--steps=1")
    assert_one_line_error(result, 1, f"dataset root {tmp_path / 'absent'} is not a directory")
    assert result.stderr.splitlines()[-1] == DEBUG_HINT


def test_impossible_flag_value_is_a_usage_error(tiny_dataset: Path) -> None:
    result = run_cli("stream", f"--dataset.root={tiny_dataset}", "--batch_size=0")
    assert_one_line_error(result, 2, "--batch_size must be >= 1, got 0")
    assert result.stderr.splitlines()[-1] == "hint: lerobot-nodes stream --help lists every flag"


def _zero_video_payloads(root: Path) -> None:
    """Overwrite the ``mdat`` payload of every MP4 with zeros: the index still parses, decoding fails."""
    for video in root.glob("videos/**/*.mp4"):
        data = bytearray(video.read_bytes())
        position = 0
        while position + 8 <= len(data):
            size = int.from_bytes(data[position : position + 4], "big")
            if data[position + 4 : position + 8] == b"mdat":
                data[position + 8 : position + size] = bytes(size - 8)
            position += size
        video.write_bytes(bytes(data))


def test_error_in_a_dataloader_worker_prints_the_original_message(tiny_dataset: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(tiny_dataset, tmp_path / "corrupt"))
    _zero_video_payloads(root)
    result = run_cli("stream", f"--dataset.root={root}", "--num_workers=2", "--steps=2")
    error = assert_one_line_error(result, 1, "clip of videos/observation.images.")
    assert "the clip's samples are corrupt or incomplete while assembling episode" in error
    assert "DataLoader worker" not in result.stderr and "Caught" not in result.stderr


def _drop_file_permission_override() -> None:
    """As root, leave out the capabilities that ignore file modes (the process starts without them)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    for capability in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_permission_error(tiny_dataset: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(tiny_dataset, tmp_path / "private"))
    (root / "meta" / "info.json").chmod(0)
    result = run_cli("stream", f"--dataset.root={root}", "--steps=1", preexec_fn=_drop_file_permission_override)
    assert_one_line_error(result, 1, f"[Errno 13] Permission denied: '{root / 'meta' / 'info.json'}'")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_debug_prints_the_traceback_above_the_error(tmp_path: Path, how: str) -> None:
    absent = tmp_path / "absent"
    if how == "flag":
        result = run_cli("stream", "--debug", f"--dataset.root={absent}")
    else:
        result = run_cli("stream", f"--dataset.root={absent}", env={"LEROBOT_NODES_DEBUG": "1"})
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert f"lerobot_nodes.errors.SourceFileNotFoundError: dataset root {absent}" in result.stderr
    assert result.stderr.splitlines()[-1] == f"error: dataset root {absent} is not a directory"


# -- the original message of an exception raised in a DataLoader worker ---------------------


class _Raising(IterableDataset):
    def __init__(self, raise_error: Callable[[], None]) -> None:
        self.raise_error = raise_error

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.raise_error()
        yield


def _decode_error_with_a_note() -> None:
    error = VideoDecodeError("clip of a.mp4: no frame at 0.5 s;\nthe clip is corrupt")
    error.add_note("while assembling episode 2, frame 0")
    raise error


def _error_with_a_cause() -> None:
    try:
        raise ValueError("the cause: MetadataError: not this line")
    except ValueError as cause:
        raise MetadataError("meta/info.json: fps must be > 0") from cause


def _source_file_not_found() -> None:
    raise SourceFileNotFoundError("data/chunk-000/file-000.parquet not found in dataset root /d")


def _os_error() -> None:
    raise PermissionError(13, "Permission denied", "/d/meta/info.json")


@pytest.mark.parametrize(
    "raise_error,kind,message",
    [
        (_decode_error_with_a_note, VideoDecodeError,
         "clip of a.mp4: no frame at 0.5 s; the clip is corrupt while assembling episode 2, frame 0"),
        (_error_with_a_cause, MetadataError, "meta/info.json: fps must be > 0"),
        (_source_file_not_found, SourceFileNotFoundError, "data/chunk-000/file-000.parquet not found in dataset root /d"),
        (_os_error, PermissionError, "[Errno 13] Permission denied: '/d/meta/info.json'"),
    ],
)
def test_error_message_is_the_same_in_a_worker_and_in_process(
    raise_error: Callable[[], None], kind: type[BaseException], message: str
) -> None:
    for num_workers in (0, 1):
        with pytest.raises(kind) as caught:
            next(iter(DataLoader(_Raising(raise_error), batch_size=None, num_workers=num_workers)))
        # Free the DataLoader now: left to the garbage collector, its worker takes 5 s to stop.
        traceback.clear_frames(caught.value.__traceback__)
        assert error_message(caught.value) == message, f"num_workers={num_workers}"
