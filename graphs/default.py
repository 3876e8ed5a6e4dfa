"""The default streaming graph of one dataset, in one call.

::

    from torchdata.nodes import Loader
    from graphs.default import streaming_graph

    graph = streaming_graph("/path/to/dataset", delta_timestamps={"action": [0.0, 1 / 30]})
    loader = Loader(graph.root)
    for sample in loader: ...
    state = loader.state_dict()          # resume later with loader.load_state_dict(state)
    graph.cache.reserved_bytes           # byte-budget accounting of this reader
    graph.close()                        # joins the fetch and decode threads

Rank and world size come from ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``) and the
worker from ``torch.utils.data.get_worker_info()`` unless given. Inside a DataLoader worker
started with ``spawn``, pass ``rank``/``world_size`` captured in the main process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import get_worker_info
from torchdata.nodes.samplers.utils import get_rank_and_world_size

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.fetch import VideoIndexProvider
from lerobot_nodes.format.meta import load_meta, select_episodes
from lerobot_nodes.metrics import MetricsSink
from lerobot_nodes.sources import ByteSource, open_source
from lerobot_nodes.streaming_graph import (
    GraphServices,
    ReaderSlot,
    SampleOptions,
    ScheduleStart,
    StreamingGraph,
    build_streaming_graph,
)


def streaming_graph(
    root: str | os.PathLike[str] | ByteSource | None = None,
    *,
    repo_id: str | None = None,
    revision: str | None = None,
    episodes: Sequence[int] | None = None,
    config: StreamingConfig | None = None,
    seed: int | None = None,
    epoch: int = 0,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    tolerance_s: float = 1e-4,
    image_transforms: Callable[[Any], Any] | None = None,
    transforms_on_consumer: bool = False,
    return_uint8: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    worker_id: int | None = None,
    num_workers: int | None = None,
    index_provider: VideoIndexProvider | None = None,
    metrics: MetricsSink | None = None,
) -> StreamingGraph:
    """Open the dataset (``root`` or ``repo_id``) and build this process's streaming graph.

    Guarantees of the graph: this (rank, worker) yields its frame-balanced share of whole
    episodes, each selected frame exactly once per epoch, in an order fixed by (seed, epoch,
    rank, worker); samples equal the map-style reader's, key for key; ``Loader`` state resumes
    the epoch exactly.
    """
    source = open_source(root, repo_id=repo_id, revision=revision)
    meta = load_meta(source, repo_id=repo_id)
    selected = select_episodes(meta, episodes)
    if rank is None or world_size is None:
        rank, world_size = get_rank_and_world_size()
    if worker_id is None or num_workers is None:
        info = get_worker_info()
        worker_id, num_workers = (0, 0) if info is None else (info.id, info.num_workers)
    return build_streaming_graph(
        source,
        meta,
        selected,
        reader=ReaderSlot(rank, world_size, worker_id, num_workers),
        config=config,
        schedule=ScheduleStart(seed=seed, epoch=epoch),
        samples=SampleOptions(
            delta_timestamps=delta_timestamps,
            tolerance_s=tolerance_s,
            image_transforms=image_transforms,
            transforms_on_consumer=transforms_on_consumer,
            return_uint8=return_uint8,
        ),
        services=GraphServices(index_provider=index_provider, metrics=metrics),
    )
