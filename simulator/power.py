"""One GPU's power, energy, clock, temperature and throttle reasons.

Power while a kernel runs is idle + (TDP - idle) x activity x clock^2.5 (dynamic power falls
faster than the clock because the voltage drops with it), where activity grows with the
compute and memory shares of the roofline. A controller, run every tick like the driver's,
lowers the SM clock while the average power exceeds the allowed power: the power limit, or
what the cooling can take before the slowdown temperature (thermal resistance x power above
the inlet temperature). It raises the clock again when there is headroom. The energy counter
integrates the power exactly over every step and idle gap.
"""

from __future__ import annotations

import math

from fleetlens.simulator.specs import GpuSpec

#: NVML clocks event reasons (nvmlClocksEventReason*).
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_SW_THERMAL = 0x20
#: activity of a GPU waiting in a collective (NCCL spin) or doing communication
WAIT_ACTIVITY = 0.25
CLOCK_EXPONENT = 2.5
INLET_C = 30.0
SLOWDOWN_C = 87.0
THERMAL_TAU_S = 20.0


def activity(compute_share: float, memory_share: float) -> float:
    """Switching activity of a kernel from its compute and memory shares of the roofline."""
    return min(1.0, 0.35 + 0.5 * compute_share + 0.45 * memory_share)


class GpuState:
    """Simulated state of one GPU (the values the agent's NVML sampler would read)."""

    def __init__(self, spec: GpuSpec, host: str, index: int, uuid: str) -> None:
        self.spec, self.host, self.index, self.uuid = spec, host, index, uuid
        self.clock = 1.0  # SM clock as a share of max_clock_mhz, set by the controller
        self.perf = 1.0  # share of bandwidth/FLOP/s delivered (slow_gpu incident)
        self.power_limit_w = spec.tdp_w
        self.inlet_c = INLET_C
        # thermal resistance so that a GPU at TDP sits at 75 C with the normal inlet
        self.resistance = (75.0 - INLET_C) / spec.tdp_w
        self.temp_c = INLET_C + self.resistance * spec.idle_w
        self.energy_j = 0.0
        self.busy_s = 0.0
        self.mem_busy_s = 0.0
        self.reasons = 0
        self.last_power_w = spec.idle_w
        self.memory_used_bytes = 0.5e9
        # health (simulator.gpu_fault): NVML answers "lost"; Xid events per code so far
        self.lost = False
        self.xid: dict[int, int] = {}
        self._tick_energy = 0.0
        self._tick_busy = 0.0

    @property
    def dynamic_w(self) -> float:
        return (self.spec.tdp_w - self.spec.idle_w) * self.clock ** CLOCK_EXPONENT

    def spend(self, kernel_s: float, act: float, memory_share: float, wait_s: float,
              idle_s: float) -> None:
        """Account a stretch of work: kernels at ``act``, collective waits, and idle gaps."""
        idle_w, dyn = self.spec.idle_w, self.dynamic_w
        energy = (idle_w * (kernel_s + wait_s + idle_s) + dyn * (act * kernel_s
                                                               + WAIT_ACTIVITY * wait_s))
        self.energy_j += energy
        self._tick_energy += energy
        busy = kernel_s + wait_s
        self.busy_s += busy
        self._tick_busy += busy
        self.mem_busy_s += kernel_s * memory_share

    def idle(self, seconds: float) -> None:
        """Account time with no kernel running."""
        if seconds > 0:
            energy = self.spec.idle_w * seconds
            self.energy_j += energy
            self._tick_energy += energy

    def allowed_w(self) -> float:
        """The power the GPU may draw: its limit, or what keeps it below slowdown."""
        thermal = (SLOWDOWN_C - self.inlet_c) / self.resistance
        return min(self.power_limit_w, thermal)

    def control(self, dt: float) -> bool:
        """End of a tick of ``dt`` seconds: update power, temperature, clock and reasons.

        Returns:
            True when the clock changed (the instance must retune its step model).
        """
        power = self._tick_energy / dt if dt > 0 else self.spec.idle_w
        busy = self._tick_busy / dt if dt > 0 else 0.0
        self._tick_energy = self._tick_busy = 0.0
        self.last_power_w = power
        target = self.inlet_c + self.resistance * power
        self.temp_c += (target - self.temp_c) * (1.0 - math.exp(-dt / THERMAL_TAU_S))
        allowed, idle_w = self.allowed_w(), self.spec.idle_w
        floor = self.spec.min_clock_mhz / self.spec.max_clock_mhz
        old = self.clock
        if power > allowed and power > idle_w:
            # dynamic power scales with clock^2.5: solve for the clock that fits the budget
            ratio = max(allowed - idle_w, 1.0) / (power - idle_w)
            self.clock = max(floor, min(1.0, old * ratio ** (1.0 / CLOCK_EXPONENT)))
        elif old < 1.0 and busy > 0.0:
            # an allowance under the idle draw (a deep cap, a hot inlet) leaves no headroom:
            # the ratio stays positive (a negative one has a complex root)
            ratio = max(allowed - idle_w, 1.0) / max(power - idle_w, 1e-9)
            self.clock = max(floor, min(1.0, old * min(ratio ** (1.0 / CLOCK_EXPONENT), 1.1)))
        elif old < 1.0:
            self.clock = min(1.0, old * 1.1)
        limited = self.clock < 1.0
        thermal_bound = (SLOWDOWN_C - self.inlet_c) / self.resistance < self.power_limit_w
        reasons = 0
        if limited:
            reasons |= REASON_SW_THERMAL if thermal_bound else REASON_SW_POWER_CAP
        if busy == 0.0:
            reasons |= REASON_GPU_IDLE
        self.reasons = reasons
        return self.clock != old

    def clock_mhz(self, busy: bool) -> float:
        """SM clock as NVML reports it: the idle clock when nothing ran."""
        return self.spec.max_clock_mhz * self.clock if busy else self.spec.idle_clock_mhz
