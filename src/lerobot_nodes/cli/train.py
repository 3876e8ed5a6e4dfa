"""``lerobot-nodes train [lerobot-train flags ...]``: LeRobot's own trainer, streaming through this package.

Every flag but the ``--dataset.streaming_*`` ones (the table of :mod:`.flags`, taken out and
checked here, before LeRobot's parser sees the command line) goes to LeRobot's ``lerobot-train``
unchanged; see :mod:`lerobot_nodes.cli.lerobot_train` for what is replaced while it runs.
``--help`` lists the streaming flags, then LeRobot's own help.
"""

from __future__ import annotations

from collections.abc import Sequence

from .flags import RENAME_MAP_FLAG, STREAMING_FLAGS, flags_help, split_streaming_flags

USAGE = """usage: lerobot-nodes train [lerobot-train flags ...] [--dataset.streaming_* flags ...]

Runs LeRobot's lerobot-train (LeRobot >= 0.6.1, Python >= 3.12) with every flag unchanged. With
--dataset.streaming=true the training data streams through lerobot_nodes' StatefulDataLoader;
--resume=true --config_path=CHECKPOINT/pretrained_model/train_config.json continues sample for sample.
"""


def run_train(argv: Sequence[str]) -> int:
    """Parse and check the streaming flags, then run LeRobot's trainer with the rest of ``argv``."""
    argv = list(argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE)
        print(flags_help({"streaming flags (lerobot_nodes)": (*STREAMING_FLAGS, RENAME_MAP_FLAG)}))
        print("\nLeRobot's lerobot-train flags:")
    streaming_options, rest = split_streaming_flags(argv)
    from .lerobot_train import run_lerobot_train

    # An impossible value is a one-line ConfigError before LeRobot is imported (TrainingSession checks it).
    return run_lerobot_train(rest, streaming_options)
