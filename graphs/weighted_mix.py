"""A resumable weighted mix of two streaming datasets.

Each dataset gets its own streaming graph (its own pool, budget and decode threads); a
``torchdata.nodes.MultiNodeWeightedSampler`` draws the next sample's dataset with the given
weights from a generator seeded by (seed, rank, world size, epoch). A dataset that runs out
starts its next epoch while the other continues (``CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED``), and
the mix ends once both finished an epoch. The sampler's state nests both graphs' states, so
``Loader.state_dict()`` resumes the mix exactly.

::

    mix = weighted_mix_graph({"sim": "/data/sim", "real": "/data/real"}, {"sim": 0.3, "real": 0.7})
    loader = Loader(mix.root)

It is for explicit weights over a few datasets only: memory and threads grow with each dataset's
graph. With every frame equally likely (each dataset weighted by its frames), one dataset of all of
them does it in one graph per worker, at any number of datasets:
``StreamingLeRobotDataset(repo_id=[...], root=[...])`` (``docs/training.md``, "Mixtures"). This
module stays until that dataset takes explicit ``weights``; then it becomes a thin example over it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchdata.nodes import BaseNode, Mapper
from torchdata.nodes.samplers.multi_node_weighted_sampler import MultiNodeWeightedSampler
from torchdata.nodes.samplers.stop_criteria import StopCriteria
from torchdata.nodes.samplers.utils import get_rank_and_world_size

from lerobot_nodes.config import resolve_seed
from lerobot_nodes.sources import ByteSource
from lerobot_nodes.streaming_graph import StreamingGraph

from .default import streaming_graph

DATASET_KEY = "dataset"
"""Key added to every sample of the mix: the name of the dataset it came from."""


@dataclass
class MixedGraph:
    """``root`` yields samples of both datasets; ``graphs`` holds each dataset's graph."""

    root: BaseNode[dict[str, Any]]
    graphs: dict[str, StreamingGraph] = field(default_factory=dict)

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()


def weighted_mix_graph(
    roots: Mapping[str, str | os.PathLike[str] | ByteSource],
    weights: Mapping[str, float],
    *,
    seed: int | None = None,
    stop_criteria: str = StopCriteria.CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED,
    tag_samples: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    **options: Any,
) -> MixedGraph:
    """Mix the datasets at ``roots`` (name -> dataset root) with ``weights`` (name -> weight).

    ``options`` go to :func:`graphs.default.streaming_graph` for every dataset (config,
    delta_timestamps, return_uint8, ...). With ``tag_samples`` each sample gains a
    ``"dataset"`` key naming its dataset.
    """
    if set(roots) != set(weights) or len(roots) < 2:
        raise ValueError(f"give the same two or more dataset names to roots and weights, got {list(roots)} / {list(weights)}")
    if any(float(w) <= 0 for w in weights.values()):
        raise ValueError(f"weights must be > 0, got {dict(weights)}")
    seed = resolve_seed(seed)
    if rank is None or world_size is None:
        rank, world_size = get_rank_and_world_size()
    graphs = {
        name: streaming_graph(root, seed=seed, rank=rank, world_size=world_size, **options)
        for name, root in roots.items()
    }
    nodes: dict[str, BaseNode[Any]] = {}
    for name, graph in graphs.items():
        nodes[name] = Mapper(graph.root, _Tag(name)) if tag_samples else graph.root
    mixed = MultiNodeWeightedSampler(
        nodes,
        {name: float(weight) for name, weight in weights.items()},
        stop_criteria=stop_criteria,
        rank=rank,
        world_size=world_size,
        seed=seed,
    )
    return MixedGraph(root=mixed, graphs=graphs)


class _Tag:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, DATASET_KEY: self.name}
