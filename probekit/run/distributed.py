"""Process layout under `torchrun` / `accelerate launch`: rank, world size, barrier, device."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Launch:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    barrier: Callable[[], None] = lambda: None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str | None) -> str | None:
        """One GPU per local process when launched on GPUs; otherwise what was asked."""
        if requested is None and self.world > 1 and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested


def detect_launch() -> Launch:
    """A distributed launch sets WORLD_SIZE; accelerate's PartialState then joins the process
    group (NCCL on GPUs, gloo on CPU) so that processes can wait for each other."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Launch()
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    if state.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return Launch(
        state.process_index, state.num_processes, state.local_process_index, state.wait_for_everyone
    )
