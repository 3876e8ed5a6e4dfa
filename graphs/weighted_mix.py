"""A resumable weighted mix of datasets: a thin example over the mixture's explicit weights.

One graph over the union (one pool, one byte budget, one set of decode threads, at any number
of datasets): :class:`~lerobot_nodes.nodes.weighted_sharder.WeightedMixtureSharder` picks the
dataset of each admitted episode by a deficit rule, each dataset is read in its own epochs (its
next one in its own seeded order when it runs out), and the stream does not end by itself (take
as many samples as training needs). ``Loader.state_dict()`` resumes the mix exactly.

::

    mix = weighted_mix_graph({"sim": "/data/sim", "real": "/data/real"}, {"sim": 0.3, "real": 0.7})
    loader = Loader(mix.root)

The same mixture as a dataset for a DataLoader or ``lerobot-train``:
``StreamingLeRobotDataset(root=[...], weights=[...])`` or ``--dataset.streaming_weights='[0.3,0.7]'``
(``docs/training.md``, "Mixtures").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode, Mapper

from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.sources import ByteSource
from lerobot_nodes.streaming_graph import (
    ReaderSlot,
    SampleOptions,
    ScheduleStart,
    StreamingGraph,
    build_streaming_graph,
)

DATASET_KEY = "dataset"
"""Key added to every sample of the mix: the name of the dataset it came from (beside ``dataset_index``)."""


@dataclass
class MixedGraph:
    """``root`` yields samples of every dataset; ``graph`` is the one graph behind it."""

    root: BaseNode[dict[str, Any]]
    graph: StreamingGraph

    def close(self) -> None:
        self.graph.close()


def weighted_mix_graph(
    roots: Mapping[str, str | os.PathLike[str] | ByteSource],
    weights: Mapping[str, float],
    *,
    seed: int | None = None,
    tag_samples: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    **options: Any,
) -> MixedGraph:
    """Mix the datasets at ``roots`` (name -> dataset root) with ``weights`` (name -> weight).

    ``options`` go to :class:`StreamingLeRobotDataset` (config, delta_timestamps, return_uint8, ...).
    With ``tag_samples`` each sample gains a ``"dataset"`` key naming its dataset.
    """
    if set(roots) != set(weights) or len(roots) < 2:
        raise ValueError(f"give the same two or more dataset names to roots and weights, got {list(roots)} / {list(weights)}")
    names = list(roots)
    dataset = StreamingLeRobotDataset(
        root=[roots[name] for name in names], weights=[float(weights[name]) for name in names],
        seed=seed, rank=rank, world_size=world_size, **options,
    )
    graph = build_streaming_graph(
        dataset.source,
        dataset.meta,
        dataset.episodes,
        reader=ReaderSlot(dataset.rank, dataset.world_size),
        config=dataset.config,
        schedule=ScheduleStart(seed=dataset.seed, weights=dataset.config.streaming_weights),
        samples=SampleOptions(
            delta_timestamps=dataset.delta_timestamps, tolerance_s=dataset.tolerance_s,
            return_uint8=dataset.return_uint8, depth_output_unit=dataset.depth_output_unit,
        ),
    )
    root: BaseNode[dict[str, Any]] = Mapper(graph.root, _Tag(names)) if tag_samples else graph.root
    return MixedGraph(root=root, graph=graph)


class _Tag:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, DATASET_KEY: self.names[int(sample["dataset_index"])]}
