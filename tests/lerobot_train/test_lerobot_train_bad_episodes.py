"""``lerobot-nodes train --dataset.streaming_bad_episodes=skip``: LeRobot's real trainer on a dataset with a bad episode.

The LeRobot-written fixture's last episode (7) gets a top-camera span 0.5 s longer than its MP4: its
metadata lists frames the video does not have. ``raise`` stops before training with one line naming
the episode; ``skip`` trains on the other seven episodes and says which one it left out.
"""

from __future__ import annotations

import subprocess

from cli.cli_process import assert_one_line_error

from lerobot_nodes.testing.damage import damage_frame, lengthen_span

from .conftest import TINY_ACT, Trainer, needs_lerobot

BAD_EPISODE = 7
TOP = "observation.images.top"
MID_EPOCH_EPISODE, MID_EPOCH_LENGTH = 2, 62


def from_dataset_creation(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``result`` with stderr from LeRobot's "Creating dataset" line on: what this package printed.

    Before it, LeRobot's own imports may log warnings with tracebacks of theirs (torchcodec without
    the system FFmpeg libraries it loads logs "Could not load libtorchcodec" with one per version)."""
    lines = result.stderr.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if "Creating dataset" in line), 0)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, "".join(lines[start:]))


@needs_lerobot
def test_skip_trains_on_the_other_episodes_and_raise_names_the_bad_one(trainer: Trainer):
    lengthen_span(trainer.root, BAD_EPISODE, TOP, 0.5)
    common = (*trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--num_workers=0",
              "--save_checkpoint=false")  # fmt: skip
    refused = trainer.run(*common, "--steps=2", f"--output_dir={trainer.tmp / 'raise'}")
    error = assert_one_line_error(from_dataset_creation(refused.result), 1, "")
    assert f"episode {BAD_EPISODE} (camera {TOP}): meta/episodes places its frames" in error
    run = trainer.run(*common, "--steps=12", "--dataset.streaming_bad_episodes=skip", f"--output_dir={trainer.tmp / 'skip'}")
    run.check()
    assert f"rank 0 leaves out video span past the end of its MP4: episode {BAD_EPISODE}: " in run.output
    streamed = {episode for _, samples in run.batches() for episode, _ in samples}
    assert streamed and BAD_EPISODE not in streamed and len(run.batches()) == 12


@needs_lerobot
def test_skip_trains_past_an_episode_found_bad_while_decoding(trainer: Trainer):
    """16 bytes over the picture data of episode 2's frame 10 (top camera): the open's checks pass,
    decoding that frame fails. ``skip`` drops the episode from its failing sample on, logs it once,
    and trains on into the next epoch without it."""
    damage_frame(trainer.root, MID_EPOCH_EPISODE, TOP, 10)
    run = trainer.run(
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--num_workers=0", "--save_checkpoint=false",
        "--steps=170", "--dataset.streaming_bad_episodes=skip", f"--output_dir={trainer.tmp / 'mid-epoch'}",
    )  # fmt: skip
    run.check()
    assert run.output.count(f"episode {MID_EPOCH_EPISODE} is bad from frame") == 1
    delivered = [frame for _, samples in run.batches() for episode, frame in samples if episode == MID_EPOCH_EPISODE]
    # 380 frames, 62 of them episode 2's, batches of 2: step 170 is in the second epoch, which has none of it.
    assert 0 < len(delivered) < MID_EPOCH_LENGTH and len(delivered) == len(set(delivered))
    assert len(run.batches()) == 170
