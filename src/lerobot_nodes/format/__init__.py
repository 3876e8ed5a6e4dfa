"""LeRobot v3.0 on disk: ``meta/`` (info, episodes, tasks, stats), the data Parquet, depth maps.

Nothing here knows about MP4 payloads, sampling or torch: it reads what the dataset says about
itself and the non-video columns of its frames.
"""
