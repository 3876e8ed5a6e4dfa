"""One sample and a batch's rows: which frames a sample asks for (``windows``), how its
columns are assembled from an episode's data (``assemble``) and gathered per batch (``batch_rows``)."""
