"""The map-style reader on generated datasets: rollover, H.264 with B-frames, dtype rules, the demo."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.cli.main import main as cli_main
from lerobot_nodes.testing import write_dataset


def _all_frames_by_pts(path):
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {frame.pts: frame.to_ndarray(format="rgb24") for frame in container.decode(stream)}, stream.time_base


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_every_frame_matches_a_whole_file_decode(tmp_path, codec):
    root = write_dataset(
        tmp_path / codec,
        episode_lengths=[23, 41, 17, 35],
        codec=codec,
        video_files_size_in_mb=0.02 if codec == "av1" else 0.004,
        data_file_size_in_mb=0.002,
        seed=3,
    )
    dataset = MapStyleLeRobotDataset(root=root, return_uint8=True)
    meta = dataset.meta
    assert len(meta.video_files()) > len(meta.video_keys), "the test needs several MP4s per camera"
    decoded = {}
    for index in range(len(dataset)):
        sample = dataset[index]
        episode, frame = dataset.locate(index)
        assert int(sample["index"]) == index and int(sample["frame_index"]) == frame
        for key in meta.video_keys:
            path = root / meta.video_file(episode, key)
            if path not in decoded:
                decoded[path] = _all_frames_by_pts(path)
            frames, time_base = decoded[path]
            start, _ = meta.video_span(episode, key)
            wanted = start + float(sample["timestamp"])
            pts = min(frames, key=lambda p: abs(float(p * time_base) - wanted))
            assert np.array_equal(sample[key].permute(1, 2, 0).numpy(), frames[pts]), (index, key)


def test_column_dtypes_follow_lerobot_rules(tmp_path):
    root = write_dataset(tmp_path / "extra", episode_lengths=[5, 7], cameras=(), extra_features=True)
    dataset = MapStyleLeRobotDataset(root=root, delta_timestamps={"next.done": [0.0, 1 / 30]})
    sample = dataset[0]
    assert sample["observation.environment_state"].dtype == torch.float32  # float64 column
    assert sample["next.reward"].dtype == torch.int64 and sample["next.reward"].shape == ()
    assert sample["next.done"].dtype == torch.bool and sample["next.done"].shape == (2,)
    assert sample["timestamp"].dtype == torch.float32 and sample["timestamp"].shape == ()
    assert sample["next.done_is_pad"].tolist() == [False, False]
    assert dataset[4]["next.done_is_pad"].tolist() == [False, True]


def test_unknown_delta_key_is_named(tmp_path):
    root = write_dataset(tmp_path / "d", episode_lengths=[5], cameras=())
    with pytest.raises(ValueError, match="not.a.feature"):
        MapStyleLeRobotDataset(root=root, delta_timestamps={"not.a.feature": [0.0]})


def test_demo_command_prints_samples(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    assert cli_main(["demo", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "episodes: 12" in out and "observation.images.top: uint8[3, 96, 128]" in out
    assert (tmp_path / "home" / "lerobot-nodes-demo" / "v1" / "meta" / "info.json").is_file()
