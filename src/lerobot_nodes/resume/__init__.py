"""Resume: which samples a checkpoint already delivered and where each reader starts again.

``planning`` works out exact and elastic starts from a step checkpoint (pure functions of the
schedule), ``identity`` says whether a saved state belongs to this dataset, and ``orchestrator``
holds a dataset's pending resume through its states until the first ``iter()`` runs it.
"""
