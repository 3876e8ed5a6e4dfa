"""lerobot_nodes: stream LeRobotDataset v3.0 into PyTorch as a graph of torchdata.nodes."""

from __future__ import annotations

__version__ = "0.1.0"
