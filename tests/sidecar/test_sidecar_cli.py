"""``lerobot-build-mp4-sidecar``: output, summary, subsets, --push, failures leaving the previous file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.cli.build_sidecar import main
from lerobot_nodes.cli.build_sidecar import main as console_main
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarArchive

from .sidecar_testkit import copy_dataset


def _archive(path: Path) -> SidecarArchive:
    return SidecarArchive.from_path(path)


def test_builds_a_complete_archive_and_prints_a_summary(
    h264_many_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out" / "sidecar.npz"
    code = console_main(["--repo-id=owner/data", "--revision=abc123", f"--data-root={h264_many_files}",
                         f"--output={output}", "--workers=2", "--quiet"])
    assert code == 0
    summary = capsys.readouterr().out
    files = len(load_meta_files(h264_many_files))
    assert f"{files} video files" in summary and "samples" in summary and "bytes read" in summary
    assert " s (" in summary and "full dataset" in summary
    with _archive(output) as archive:
        assert archive.meta.complete and archive.meta.dataset_id == "owner/data"
        assert archive.meta.revision == archive.meta.source_commit == "abc123"
        assert len(archive.paths) == files
    assert sorted(p.name for p in output.parent.iterdir()) == ["sidecar.npz"]


def load_meta_files(root: Path) -> list[str]:
    from lerobot_nodes.sources import LocalSource

    return load_meta(LocalSource(root)).video_files()


def test_workers_do_not_change_the_content(h264_many_files: Path, tmp_path: Path) -> None:
    for workers in (1, 3):
        assert main([f"--data-root={h264_many_files}", f"--output={tmp_path / f'w{workers}.npz'}",
                     f"--workers={workers}", "--quiet"]) == 0
    with _archive(tmp_path / "w1.npz") as one, _archive(tmp_path / "w3.npz") as three:
        assert one.paths == three.paths
        for path in one.paths:
            a, b = one.load_arrays(path), three.load_arrays(path)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_subset_is_marked_and_cannot_be_pushed(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "subset.npz"
    assert main([f"--data-root={av1_dataset}", f"--output={output}", "--episodes=0,1", "--quiet"]) == 0
    assert "SUBSET" in capsys.readouterr().out
    with _archive(output) as archive:
        assert archive.meta.complete is False
    assert main([f"--data-root={av1_dataset}", f"--output={tmp_path / 'x.npz'}", "--episodes=0", "--push"]) == 2
    assert "subset" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_the_other_commands_spelling_of_root_and_episodes_builds_the_same_subset(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, spelled = tmp_path / "plain.npz", tmp_path / "spelled.npz"
    assert main([f"--data-root={av1_dataset}", f"--output={plain}", "--episodes=0,1", "--quiet"]) == 0
    assert main([f"--dataset.root={av1_dataset}", f"--output={spelled}", "--dataset.episodes=[0, 1]", "--quiet"]) == 0
    with _archive(plain) as one, _archive(spelled) as other:
        assert one.meta.complete is False and other.meta.complete is False
        assert sorted(one.paths) == sorted(other.paths) and len(one.paths) > 0


def test_push_of_a_local_folder_errors_clearly_before_building(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "pushed.npz"
    assert main([f"--data-root={av1_dataset}", f"--output={output}", "--push"]) == 2
    error = capsys.readouterr().err
    assert "Hub dataset repo or bucket" in error and "copy the verified archive" in error
    assert not output.exists()


def test_failed_build_keeps_the_previous_output(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    output = tmp_path / "out" / "sidecar.npz"
    assert main([f"--data-root={root}", f"--output={output}", "--quiet"]) == 0
    previous = output.read_bytes()
    video = root / load_meta_files(root)[-1]
    video.write_bytes(video.read_bytes()[:200])  # its moov is gone: indexing fails
    capsys.readouterr()
    assert main([f"--data-root={root}", f"--output={output}", "--workers=2"]) == 1
    error = capsys.readouterr().err
    *_, line, hint = error.splitlines()
    assert line.startswith(f"error: build failed, {output} was left as it was: ") and "Traceback" not in error
    assert hint == "hint: --debug (or LEROBOT_NODES_DEBUG=1) prints the full traceback"
    assert output.read_bytes() == previous
    assert sorted(p.name for p in output.parent.iterdir()) == ["sidecar.npz"]  # nothing partial


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workers=0"], "--workers must be >= 1, got 0"),
        (["--episodes=1,x"], "--episodes must be episode indices, comma-separated (0,3) or a JSON list ([0,3]), got '1,x'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_usage_errors(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main([f"--data-root={av1_dataset}", f"--output={tmp_path / 'a.npz'}", *args]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {message}", "hint: lerobot-build-mp4-sidecar --help lists every flag"
    ]


def test_missing_required_flags_are_usage_errors(
    av1_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([f"--output={tmp_path / 'a.npz'}"]) == 2
    assert capsys.readouterr().err.startswith("error: give --data-root or --repo-id\n")
    assert main([f"--data-root={av1_dataset}"]) == 2
    assert capsys.readouterr().err.startswith("error: the following arguments are required: --output\n")
