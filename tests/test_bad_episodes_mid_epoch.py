"""``streaming_bad_episodes=skip`` for an episode found bad while decoding, mid-epoch (issue 26, item 6).

A real dataset (``lerobot_nodes.testing.write_dataset``) gets 16 random bytes written over the
picture data of one frame in the second half of episode 3's video (``testing.damage.damage_frame``,
the damage of ``tests/mp4/test_damaged_video.py``): the MP4 and the metadata are intact, so the open's
checks pass and only decoding that frame fails. The schedule is the clean dataset's; with ``skip``
the run delivers exactly the clean run's samples minus those of episode 3 from its failing sample on
(in the clean run's order with no workers; per episode in that order with two), logs it once, counts
it, keeps it out of the next epoch without decoding it, and a loader state taken after the skip
resumes without delivering it and without logging it again. ``raise`` stops at the frame, naming the
file, the episode and the frame.
"""

from __future__ import annotations

import collections
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError, VideoDecodeError
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader
from lerobot_nodes.nodes.bad_episode_filter import BadEpisodeFilter
from lerobot_nodes.resume.identity import FOUND_BAD
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.damage import damage_frame

LENGTHS = [40, 50, 45, 60, 35, 55]
CAMERA = "observation.images.top"
DAMAGED, DAMAGED_FROM = 3, 40  # detected with seed 0 on both codecs (not every frame is: see tests/mp4)
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=2)
SKIP = StreamingConfig(**{**CONFIG.as_dict(), "streaming_bad_episodes": "skip"})
SEED = 7
BATCH = 4
FOUND = "is bad from frame"

Pair = tuple[int, int]


@pytest.fixture(scope="module", params=["av1", "h264"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp(f"mid-epoch-{request.param}") / "dataset", episode_lengths=LENGTHS, seed=3,
        cameras=(CAMERA,), codec=request.param, data_file_size_in_mb=0.003, video_files_size_in_mb=0.01,
    )  # fmt: skip


@pytest.fixture(scope="module")
def damaged(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = Path(shutil.copytree(pristine, tmp_path_factory.mktemp("damaged") / "dataset"))
    mp4, _ = damage_frame(root, DAMAGED, CAMERA, DAMAGED_FROM)
    return root, mp4


OPENED: list[StreamingLeRobotDataset] = []


@pytest.fixture(autouse=True)
def close_datasets() -> Iterator[None]:
    """Without workers a dataset's graph (its fetch and decode threads) lives in this process until closed."""
    yield
    while OPENED:
        OPENED.pop().close()


def dataset(root: Path, config: StreamingConfig = SKIP) -> StreamingLeRobotDataset:
    opened = StreamingLeRobotDataset(root=root, config=config, seed=SEED, return_uint8=True)
    OPENED.append(opened)
    return opened


def pairs(batch: dict[str, Any]) -> list[Pair]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def epoch(loader: Any) -> list[Pair]:
    return [pair for batch in loader for pair in pairs(batch)]


def epoch_with_frames(loader: Any) -> tuple[list[Pair], dict[Pair, bytes]]:
    """The epoch's pairs and each pair's camera frame (its bytes)."""
    seen: list[Pair] = []
    frames: dict[Pair, bytes] = {}
    for batch in loader:
        for row, pair in enumerate(pairs(batch)):
            seen.append(pair)
            frames[pair] = batch[CAMERA][row].numpy().tobytes()
    return seen, frames


def of_episode(seen: list[Pair], episode: int) -> list[Pair]:
    return [pair for pair in seen if pair[0] == episode]


def found_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if FOUND in r.getMessage() and f"episode {DAMAGED} " in r.getMessage()]


def states_with_bad(state: Any) -> Iterator[list[int]]:
    """Every bad-episode list in a (nested) loader state."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == BadEpisodeFilter.BAD_KEY:
                yield list(value)
            else:
                yield from states_with_bad(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from states_with_bad(value)


def assert_skipped_from_failure(seen: list[Pair], clean: list[Pair], exact_order: bool) -> int:
    """``seen`` is ``clean`` without episode DAMAGED from some sample on (not its first, not past its
    last); returns how many of its samples were delivered."""
    kept = of_episode(seen, DAMAGED)
    scheduled = of_episode(clean, DAMAGED)
    delivered = len(kept)
    assert 0 < delivered < LENGTHS[DAMAGED]
    assert kept == scheduled[:delivered]  # what was delivered is what the clean run delivered first
    expected = [p for p in clean if p[0] != DAMAGED or p in set(scheduled[:delivered])]
    if exact_order:
        assert seen == expected
    else:  # two workers: batches of a short worker join others than in the clean run
        assert collections.Counter(seen) == collections.Counter(expected)
        for episode in range(len(LENGTHS)):
            assert of_episode(seen, episode) == of_episode(expected, episode)
    return delivered


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_drops_the_episode_from_its_failing_sample_on(
    damaged: tuple[Path, str], pristine: Path, num_workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    root, mp4 = damaged
    clean_loader = streaming_dataloader(dataset(pristine), BATCH, num_workers)
    (clean_first, clean_frames), clean_second = epoch_with_frames(clean_loader), epoch(clean_loader)
    shutdown_dataloader(clean_loader)
    chosen = dataset(root)
    loader = streaming_dataloader(chosen, BATCH, num_workers)
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes"):
        first, frames = epoch_with_frames(loader)
        delivered = assert_skipped_from_failure(first, clean_first, exact_order=num_workers == 0)
        # Samples decoded into batch places that the dropped ones shifted are still their own frames.
        assert all(frames[pair] == clean_frames[pair] for pair in first)
        failing_frame = of_episode(clean_first, DAMAGED)[delivered][1]
        [record] = found_records(caplog)
        message = record.getMessage()
        assert f"episode {DAMAGED} is bad from frame {failing_frame} on" in message
        assert Path(mp4).name in message and ("decoding failed" in message or "no frame" in message)
        assert f"while assembling episode {DAMAGED}, frame {failing_frame}" in message
        report = chosen.metrics.report()
        assert (report.bad_episodes_found, report.bad_samples_dropped) == (1, LENGTHS[DAMAGED] - delivered)
        assert "found while decoding: 1 episode, " in report.table() and "skipped as bad: " in report.line()

        # The next epoch: the episode is left out whole, and its samples are not decoded again.
        decoded_before = chosen.counters.totals()["samples"]
        second = epoch(loader)
        decoded = chosen.counters.totals()["samples"] - decoded_before
    shutdown_dataloader(loader)
    expected = [p for p in clean_second if p[0] != DAMAGED]
    if num_workers == 0:
        assert second == expected
    else:
        assert collections.Counter(second) == collections.Counter(expected)
    assert decoded == len(second)
    assert len(found_records(caplog)) == 1  # logged once over both epochs
    assert chosen.metrics.report().bad_samples_dropped == 2 * LENGTHS[DAMAGED] - delivered


@pytest.mark.parametrize("num_workers", [0, 2])
def test_raise_names_the_file_the_episode_and_the_frame(damaged: tuple[Path, str], num_workers: int) -> None:
    root, mp4 = damaged
    loader = streaming_dataloader(dataset(root, CONFIG), BATCH, num_workers)
    try:
        with pytest.raises(VideoDecodeError) as raised:
            epoch(loader)
    finally:
        shutdown_dataloader(loader)
    text = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", ())])
    assert Path(mp4).name in text and "pts" in text
    assert f"while assembling episode {DAMAGED}, frame " in text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_state_after_the_skip_resumes_without_its_samples(
    damaged: tuple[Path, str], num_workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = damaged
    reference_loader = streaming_dataloader(dataset(root), BATCH, num_workers)
    reference = epoch(reference_loader)
    shutdown_dataloader(reference_loader)
    loader = streaming_dataloader(dataset(root), BATCH, num_workers, snapshot_every_n_steps=1)
    head: list[Pair] = []
    state = None
    for batch in loader:
        head += pairs(batch)
        taken = loader.state_dict()
        if any(DAMAGED in bad for bad in states_with_bad(taken)):
            state = taken  # the first state that knows the episode is bad
            break
    shutdown_dataloader(loader)
    assert state is not None, "no loader state recorded the damaged episode"
    caplog.clear()
    resumed = streaming_dataloader(dataset(root), BATCH, num_workers, snapshot_every_n_steps=1)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes"):
        tail = epoch(resumed)
    shutdown_dataloader(resumed)
    assert head + tail == reference
    assert not found_records(caplog)  # known from the state: not found again, not logged again
    assert len(of_episode(reference, DAMAGED)) < LENGTHS[DAMAGED]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_step_resume_past_an_episode_found_bad_is_refused(damaged: tuple[Path, str], num_workers: int) -> None:
    root, _ = damaged
    chosen = dataset(root)
    loader = streaming_dataloader(chosen, BATCH, num_workers)
    steps = 0
    for _ in loader:
        steps += 1
        if chosen.metrics.report().bad_episodes_found:
            break
    identity = chosen.checkpoint_identity()
    shutdown_dataloader(loader)
    assert identity[FOUND_BAD] == 1
    # A step offset counts delivered samples; the reader had dropped more: refused with one line.
    with pytest.raises(ConfigError, match="cannot resume by step offset: the checkpointed run skipped 1 episode found"):
        dataset(root).resume_from_step(steps, BATCH, num_workers, identity=identity)
    # A run that found none records nothing and resumes by step as before.
    clean = dataset(root)
    assert FOUND_BAD not in clean.checkpoint_identity()
    clean.resume_from_step(1, BATCH, num_workers, identity=clean.checkpoint_identity())
