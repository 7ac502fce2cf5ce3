"""gpu_fault incidents: a GPU falls off the bus (Xid 79), its engines die, and it comes back.

At the start NVML logs Xid 79 for the GPU (its ``gpu.xid.errors{gpu.xid.code=79}`` rises by
1; the count stays after the fault, as the agent's counts since it started) and answers
``GpuIsLost`` for it until the end: the agent reports ``gpu.lost`` = 1 and, as its sampler
skips a lost GPU, none of the GPU's other metrics. Every engine with that GPU in its
(tensor-parallel) group dies exactly as at an engine_down (``simulator.failures``: requests
lost or refused, ``up`` = 0) and restarts at the end, cold, when the GPU is back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetlens.pipeline.schema.causes import Cause
from fleetlens.simulator.power import GpuState
from fleetlens.simulator.scenario import Incident, ScenarioError

if TYPE_CHECKING:
    from fleetlens.simulator.incidents import Targets

#: NVIDIA Xid 79: "GPU has fallen off the bus"
XID_FELL_OFF_BUS = 79


def check(x: Incident, t: Targets, where: str) -> None:
    """Refuse a gpu_fault that does not name exactly one GPU."""
    if Cause(x.kind) is Cause.GPU_FAULT and (x.gpu < 0 or x.service or len(t.gpus) != 1):
        raise ScenarioError(f"{where}: gpu_fault takes exactly one GPU: give 'gpu' = "
                            "'host:index' only")


class GpuFaults:
    """The GPUs lost now; flips :attr:`GpuState.lost` and counts the Xid of each loss."""

    def __init__(self) -> None:
        self.lost: list[GpuState] = []

    def update(self, gpus: list[GpuState]) -> None:
        """Make exactly ``gpus`` lost: a GPU newly lost logs one Xid 79, one no longer in
        ``gpus`` answers again."""
        for g in self.lost:
            if g not in gpus:
                g.lost = False
        for g in gpus:
            if not g.lost:
                g.lost = True
                g.xid[XID_FELL_OFF_BUS] = g.xid.get(XID_FELL_OFF_BUS, 0) + 1
        self.lost = list(gpus)
