"""DataLoader worker processes: the server they are forked from (``server``), the lifeline that
ends them with their parent (``lifeline``), their log relay (``logs``) and the shared-memory
segments they hand batches and counters through (``shared_segments``)."""
