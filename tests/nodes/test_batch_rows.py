"""A batch's rows gathered per episode (lerobot_nodes.sample.batch_rows) equal each sample's rows stacked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from lerobot_nodes.errors import MetadataError
from lerobot_nodes.format.episode_data import EpisodeData
from lerobot_nodes.nodes.batcher import collate_into_one_storage, collate_partial_samples
from lerobot_nodes.sample.assemble import SampleSpec
from lerobot_nodes.sample.batch_rows import PartialSample

CAMERA = "observation.images.top"


def _episode(episode_index: int, length: int, *, with_text: bool = False) -> EpisodeData:
    rng = np.random.default_rng(episode_index)
    arrays = {
        "observation.state": rng.random((length, 3), dtype=np.float32),
        "action": rng.random((length, 2), dtype=np.float32),
        "timestamp": (np.arange(length) / 30).astype(np.float32),
        "frame_index": np.arange(length, dtype=np.int64),
        "episode_index": np.full(length, episode_index, dtype=np.int64),
        "index": np.arange(length, dtype=np.int64) + 100 * episode_index,
        "task_index": np.full(length, episode_index % 2, dtype=np.int64),
        "done": np.arange(length) == length - 1,
    }
    objects = {"note": [f"e{episode_index}f{f}" for f in range(length)]} if with_text else {}
    order = list(arrays) + list(objects)
    return EpisodeData(episode_index=episode_index, from_index=100 * episode_index, arrays=arrays, objects=objects, column_order=order)


def _spec(offsets: dict[str, list[int]] | None) -> SampleSpec:
    return SampleSpec(
        video_keys=(CAMERA,),
        image_keys=(),
        depth_keys=(),
        tasks=("pick", "place"),
        offsets=None if offsets is None else {key: np.array(value, dtype=np.int64) for key, value in offsets.items()},
    )


def _partials(spec: SampleSpec, picks: list[tuple[EpisodeData, int]]) -> list[PartialSample]:
    # A camera frame per sample, not in place: the batcher stacks it beside the rows.
    return [
        PartialSample(spec, {CAMERA: torch.full((3, 2, 2), frame % 256, dtype=torch.uint8)}, episode, frame)
        for episode, frame in picks
    ]


def _assert_equal(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


WINDOWS = [
    None,
    {"action": [0, 1, 2, 3], "observation.state": [-2, -1, 0]},
    {"action": [-1, 0, 5], CAMERA: [-1, 0], "done": [0, 1]},
]


@pytest.mark.parametrize("offsets", WINDOWS)
@pytest.mark.parametrize("shared", [False, True])
def test_gathered_rows_equal_each_samples_rows_collated(offsets, shared):
    spec = _spec(offsets)
    short, long = _episode(0, 4), _episode(1, 9)
    # Interleaved episodes, both ends of each (windows padded before and after), a frame twice.
    picks = [(long, 0), (short, 3), (long, 8), (short, 0), (long, 4), (long, 4), (short, 1), (long, 7)]
    samples = _partials(spec, picks)
    got = collate_partial_samples(samples, shared)
    expected = default_collate([sample.complete() for sample in samples])
    _assert_equal(got, expected)
    assert got["task"] == ["place", "pick", "place", "pick", "place", "place", "pick", "place"]
    if offsets and "action" in offsets:
        assert got["action_is_pad"].any() and not got["action_is_pad"].all()
    rows = [value for key, value in got.items() if isinstance(value, torch.Tensor) and key != CAMERA]
    assert len({value.untyped_storage().data_ptr() for value in rows}) == 1  # one storage for the batch
    assert all(value.is_shared() == shared for value in rows)


def test_columns_of_python_objects_take_the_per_sample_route():
    spec = _spec({"action": [0, 1]})
    episode = _episode(2, 5, with_text=True)
    samples = _partials(spec, [(episode, 4), (episode, 0)])
    got = collate_partial_samples(samples, False)
    _assert_equal(got, collate_into_one_storage([sample.complete() for sample in samples], False))
    assert got["note"] == ["e2f4", "e2f0"]


def test_a_task_index_without_a_task_names_the_episode_and_frame():
    spec = _spec(None)
    episode = _episode(3, 6)
    episode.arrays["task_index"][2] = 7
    with pytest.raises(MetadataError, match=r"episode 3, frame 2: task_index 7 is not in meta/tasks.parquet"):
        collate_partial_samples(_partials(spec, [(episode, 1), (episode, 2)]), False)


@pytest.mark.parametrize("with_text", [False, True])
def test_cameras_written_in_place_are_the_batch_itself_on_both_routes(with_text):
    from lerobot_nodes.batch_memory.batch_slots import BatchSlots

    spec = _spec({"action": [0, 1]})
    episode = _episode(4, 6, with_text=with_text)
    slots = BatchSlots(3, {CAMERA: 1}, lambda key, episode: (2, 2), return_uint8=True, shared_memory=False)
    samples = []
    for frame in (5, 0, 2):
        place = slots.next_slot(episode=4)[CAMERA]
        place.frames[...] = frame  # what a decode thread does
        samples.append(PartialSample(spec, {CAMERA: place}, episode, frame))
    got = collate_partial_samples(samples, False)
    assert got[CAMERA].data_ptr() == samples[0].cameras[CAMERA].batch.data_ptr()  # not copied
    assert got[CAMERA].shape == (3, 3, 2, 2) and got[CAMERA][:, 0, 0, 0].tolist() == [5, 0, 2]
    expected = default_collate(
        [PartialSample(spec, {CAMERA: s.cameras[CAMERA].tensor().clone()}, episode, s.frame).complete() for s in samples]
    )
    _assert_equal(got, expected)
