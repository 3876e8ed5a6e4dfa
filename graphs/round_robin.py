"""The streaming graph with the ``round_robin`` pool strategy.

Each round shuffles the resident episodes and takes one frame of each, so every batch
mixes as many episodes as the pool holds; episodes admitted during a round join the next.
Coverage, budgets and resume are those of the default graph. ``round_robin`` is also the default
strategy of a new run; this graph pins it, so a resumed one never adopts a checkpoint's other strategy.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.sources import ByteSource
from lerobot_nodes.streaming_graph import StreamingGraph

from .default import streaming_graph


def round_robin_graph(
    root: str | os.PathLike[str] | ByteSource | None = None,
    *,
    config: StreamingConfig | None = None,
    **options: Any,
) -> StreamingGraph:
    """:func:`graphs.default.streaming_graph` with ``streaming_sampling_strategy="round_robin"``."""
    config = dataclasses.replace(config or StreamingConfig(), streaming_sampling_strategy="round_robin")
    return streaming_graph(root, config=config, **options)
