"""Ready-made streaming graphs to import or copy (the repository root must be on ``sys.path``).

- :func:`graphs.default.streaming_graph`: the default graph of SPEC section 2 for one dataset;
- :func:`graphs.round_robin.round_robin_graph`: the same with the ``round_robin`` pool strategy;
- :func:`graphs.weighted_mix.weighted_mix_graph`: a resumable weighted mix of datasets (one graph, explicit weights).

Each returns an object whose ``root`` is a ``torchdata.nodes.BaseNode`` of samples; wrap it
in ``torchdata.nodes.Loader`` to iterate, checkpoint (``state_dict``) and resume.
"""

from __future__ import annotations

from .default import streaming_graph
from .round_robin import round_robin_graph
from .weighted_mix import MixedGraph, weighted_mix_graph

__all__ = ["MixedGraph", "round_robin_graph", "streaming_graph", "weighted_mix_graph"]
