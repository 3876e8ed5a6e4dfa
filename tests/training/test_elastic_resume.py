"""Elastic resume with real DataLoader worker processes: a 2 ranks x 2 workers run stopped mid-epoch
continues as 1 x 3, 3 x 1, or with batch size 8 -> 12; the epoch delivers every frame exactly once."""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys

import pytest

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader

OLD_WORLD, OLD_WORKERS, OLD_BATCH, STOP = 2, 2, 8, 5  # each rank has about 12 batches per epoch
SEED = 3


def _config(strategy):
    return StreamingConfig(
        streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=1,
        streaming_sampling_strategy=strategy,
    )


def _dataset(root, strategy, rank, world_size):
    return StreamingLeRobotDataset(root=root, seed=SEED, return_uint8=True, config=_config(strategy), rank=rank, world_size=world_size)


def _pairs(batch):
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


@pytest.fixture(scope="module")
def every_frame(small_dataset):
    reference = MapStyleLeRobotDataset(root=small_dataset)
    return collections.Counter(reference.locate(i) for i in range(len(reference)))


@pytest.fixture(scope="module", params=["remaining", "round_robin"])
def interrupted(request, small_dataset):
    """(strategy, what the 2 x 2 run delivered in its first STOP steps on every rank)."""
    delivered = []
    for rank in range(OLD_WORLD):
        loader = streaming_dataloader(_dataset(small_dataset, request.param, rank, OLD_WORLD), OLD_BATCH, OLD_WORKERS)
        iterator = iter(loader)
        for _ in range(STOP):
            delivered += _pairs(next(iterator))
        shutdown_dataloader(loader)
    return request.param, delivered


def _resumed_epochs(root, strategy, world_size, num_workers, batch_size, epochs=1):
    """Every sample each new rank delivers in ``epochs`` epochs after resuming the step checkpoint."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(epochs)]
    for rank in range(world_size):
        dataset = _dataset(root, strategy, rank, world_size)
        dataset.resume_from_step(STOP, OLD_BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=SEED)
        loader = streaming_dataloader(dataset, batch_size, num_workers)
        for epoch in range(epochs):
            for batch in loader:
                out[epoch] += _pairs(batch)
        shutdown_dataloader(loader)
    return out


@pytest.mark.parametrize(
    "world_size,num_workers,batch_size", [(1, 3, OLD_BATCH), (3, 1, OLD_BATCH), (OLD_WORLD, OLD_WORKERS, 12)]
)
def test_the_rest_of_the_epoch_is_delivered_once_in_a_new_topology(
    small_dataset, interrupted, every_frame, world_size, num_workers, batch_size, caplog
):
    strategy, delivered = interrupted
    with caplog.at_level(logging.INFO, logger="lerobot_nodes.dataset"):
        (rest,) = _resumed_epochs(small_dataset, strategy, world_size, num_workers, batch_size)
    assert collections.Counter(delivered + rest) == every_frame, (strategy, world_size, num_workers, batch_size)
    lines = [r.message for r in caplog.records if r.message.startswith(f"resuming step {STOP} (batch size {OLD_BATCH})")]
    assert len(lines) == world_size  # one line per rank, from the training process
    if (world_size, num_workers) != (OLD_WORLD, OLD_WORKERS):
        assert "the topology changed" in lines[0] and "exactly once" in lines[0] and "order differs" in lines[0]
        assert "of a 2 rank(s) x 2 worker(s) run" in lines[0]
    else:
        assert lines[0].endswith("batch boundaries differ from an uninterrupted run") and "batch size 12" in lines[0]


def test_later_epochs_use_the_new_topology_from_scratch(small_dataset, every_frame):
    delivered = []
    for rank in range(OLD_WORLD):
        loader = streaming_dataloader(_dataset(small_dataset, "remaining", rank, OLD_WORLD), OLD_BATCH, OLD_WORKERS)
        iterator = iter(loader)
        for _ in range(STOP):
            delivered += _pairs(next(iterator))
        shutdown_dataloader(loader)
    rest, following = _resumed_epochs(small_dataset, "remaining", 1, 3, OLD_BATCH, epochs=2)
    assert collections.Counter(delivered + rest) == every_frame
    assert collections.Counter(following) == every_frame
    again = _resumed_epochs(small_dataset, "remaining", 1, 3, OLD_BATCH)[0]
    assert again == rest  # same checkpoint, same new topology: same samples


def test_a_schedule_the_replay_cannot_reproduce_is_refused(small_dataset):
    checkpointed = _dataset(small_dataset, "remaining", 0, OLD_WORLD)
    resumed = _dataset(small_dataset, "round_robin", 0, 1)
    with pytest.raises(ConfigError, match=r"streaming_sampling_strategy 'remaining' -> 'round_robin'"):
        resumed.resume_from_step(STOP, OLD_BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=SEED, identity=checkpointed.identity)
    other_selection = StreamingLeRobotDataset(
        root=small_dataset, seed=SEED, config=_config("remaining"), episodes=[0, 1, 2, 3, 4, 5], world_size=1, rank=0
    )
    with pytest.raises(ConfigError, match=r"episode selection"):
        other_selection.resume_from_step(STOP, OLD_BATCH, OLD_WORKERS, world_size=OLD_WORLD, identity=checkpointed.identity)


def test_a_loader_state_of_another_topology_names_the_step_resume(small_dataset):
    dataset = _dataset(small_dataset, "remaining", 1, OLD_WORLD)
    loader = streaming_dataloader(dataset, OLD_BATCH, 0)
    next(iter(loader))
    state = dataset.state_dict()
    dataset.close()  # the training process's graph threads
    with pytest.raises(ConfigError, match=r"world_size 2 -> 3.*resume_from_step\(step, batch_size, num_workers=0, world_size=2, seed=3\)"):
        _dataset(small_dataset, "remaining", 1, 3).load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_loader_state_taken_in_the_remnant_epoch_resumes_exactly(small_dataset, num_workers):
    datasets = []

    def resumed_loader():
        dataset = _dataset(small_dataset, "round_robin", 0, 1)
        dataset.resume_from_step(STOP, OLD_BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=SEED)
        datasets.append(dataset)
        return streaming_dataloader(dataset, 4, num_workers, snapshot_every_n_steps=1)

    def epochs(loader, iterator, count):
        out = [_pairs(b) for b in iterator]
        for _ in range(count - 1):
            out += [_pairs(b) for b in loader]
        return out

    reference_loader = resumed_loader()
    reference = epochs(reference_loader, iter(reference_loader), 2)
    shutdown_dataloader(reference_loader)
    loader = resumed_loader()
    iterator = iter(loader)
    head = [_pairs(next(iterator)) for _ in range(6)]
    state = loader.state_dict()
    shutdown_dataloader(loader)
    datasets.append(_dataset(small_dataset, "round_robin", 0, 1))
    restored = streaming_dataloader(datasets[-1], 4, num_workers, snapshot_every_n_steps=1)
    restored.load_state_dict(state)
    tail = epochs(restored, iter(restored), 2)
    shutdown_dataloader(restored)
    for dataset in datasets:
        dataset.close()  # with num_workers=0 the graphs run in this process
    assert head + tail == reference


def _stream(root, rank, world_size, *flags, check=True):
    """``lerobot-nodes stream`` as one rank of a ``world_size`` run (RANK/WORLD_SIZE, as torchrun sets them)."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "lerobot_nodes.cli.main", "stream", f"--dataset.root={root}", f"--seed={SEED}",
        "--dataset.streaming_episode_pool_size=2", "--quiet", *flags,
    ]
    return subprocess.run(command, check=check, timeout=300, env=env, capture_output=not check, text=True)


def _recorded(path):
    return [tuple(pair) for line in path.read_text().splitlines() for pair in json.loads(line)["samples"]]


def test_the_stream_command_resumes_a_checkpoint_of_another_topology_from_its_step(small_dataset, tmp_path, every_frame):
    delivered = []
    for rank in range(OLD_WORLD):
        _stream(
            small_dataset, rank, OLD_WORLD, f"--num_workers={OLD_WORKERS}", f"--batch_size={OLD_BATCH}",
            f"--steps={STOP}", f"--save-checkpoint={tmp_path / f'rank{rank}.pt'}", f"--record={tmp_path / f'old{rank}.jsonl'}",
        )
        delivered += _recorded(tmp_path / f"old{rank}.jsonl")
    # One rank of three workers resumes rank 0's checkpoint (any old rank's would do: they share the step).
    record = tmp_path / "new.jsonl"
    _stream(
        small_dataset, 0, 1, "--num_workers=3", "--batch_size=12", "--steps=40", f"--resume={tmp_path / 'rank0.pt'}",
        f"--record={record}", f"--save-checkpoint={tmp_path / 'new.pt'}",
    )
    rest = _recorded(record)
    # The remnant epoch comes first: the shortest prefix that completes the epoch must hold each frame once.
    seen = collections.Counter(delivered)
    remnant = 0
    while len(seen) < len(every_frame) and remnant < len(rest):
        seen[rest[remnant]] += 1
        remnant += 1
    assert seen == every_frame, f"after {remnant} resumed samples"
    epoch = sum(every_frame.values())
    following = rest[remnant : remnant + epoch]  # the next epoch, from scratch in the new topology
    assert len(following) == epoch and collections.Counter(following) == every_frame
    # Its own checkpoints resume exactly in its topology, but their step cannot be replayed again elsewhere.
    refused = _stream(small_dataset, 0, 1, "--num_workers=2", "--batch_size=12", "--steps=45", f"--resume={tmp_path / 'new.pt'}", check=False)
    assert refused.returncode != 0 and "cannot be replayed through two topologies" in refused.stderr
