"""Run by tests/test_training.py under torchrun (not a test itself): train like
scripts/train.py, then save this rank's parameters, so the test can compare the ranks.

    python -m torch.distributed.run ... tests/torchrun_worker.py RUN_DIR OUT_DIR [overrides]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from transformer.run.compose import compose_config
from transformer.runtime import init_distributed, resolve_device
from transformer.training.trainer import Trainer


def main() -> None:
    run_dir, out_dir, *overrides = sys.argv[1:]
    cfg = compose_config(overrides)
    env = init_distributed(resolve_device(cfg.trainer.device, "trainer.device"))
    trainer = Trainer(cfg, Path(run_dir), env)
    result = trainer.fit()
    torch.save({"model": trainer.model.state_dict(), "num_updates": result.state.num_updates,
                "world_size": env.world_size},
               Path(out_dir) / f"rank{env.rank}.pt")
    trainer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
