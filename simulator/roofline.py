"""Step times from a roofline model of the GPU.

One engine step reads the weights once, reads the KV cache of every sequence in the batch,
and does 2 x params FLOPs per token plus attention FLOPs per (token, context token). Its
kernel time is the larger of bytes / bandwidth and FLOPs / peak (both per GPU of the
tensor-parallel group and scaled by the group's slowest clock and performance factor), plus
the all-reduces of tensor parallelism and a fixed CPU overhead per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.simulator.specs import GpuSpec, ModelSpec


@dataclass
class StepModel:
    """Per-instance constants of the step time; :meth:`retune` when clocks or faults change.

    Attributes:
        overhead_s: CPU time per step during which the GPU idles (scheduling, launch).
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    mfu: float
    bandwidth_efficiency: float
    overhead_s: float

    def __post_init__(self) -> None:
        self.weights = self.model.weight_bytes / self.tp
        self.kv_bytes = self.model.kv_bytes_per_token / self.tp
        self.flops_per_token = 2.0 * self.model.params / self.tp
        self.attn_flops = self.model.attn_flops_per_context_token / self.tp
        self.retune(1.0, 1.0, 1.0, 0.0)

    def retune(self, clock: float, perf: float, link_slowdown: float, extra_overhead_s: float
               ) -> None:
        """Set the group's clock factor (slowest GPU, 0..1), performance factor (slow GPU),
        interconnect slowdown and extra CPU time per step."""
        speed = clock * perf
        self.flops_rate = self.gpu.peak_tflops * 1e12 * self.mfu * speed
        self.bytes_rate = self.gpu.hbm_gbps * 1e9 * self.bandwidth_efficiency * speed
        self.step_overhead = self.overhead_s + extra_overhead_s
        if self.tp > 1:
            ring = 2.0 * (self.tp - 1) / self.tp
            count = 2 * self.model.layers  # two all-reduces per layer
            self.comm_fixed = count * self.gpu.link_latency_us * 1e-6 * link_slowdown
            self.comm_per_token = (count * ring * self.model.hidden * self.model.dtype_bytes
                                   / (self.gpu.link_gbps * 1e9 / link_slowdown))
        else:
            self.comm_fixed = self.comm_per_token = 0.0

    def step(self, tokens: int, context_read: int, attn_context: float
             ) -> tuple[float, float, float, float]:
        """One step: ``tokens`` processed, ``context_read`` KV tokens read, ``attn_context``
        sum over tokens of the context each attends to.

        Returns:
            (kernel_s, compute_s, memory_s, comm_s): kernel time is max(compute, memory).
        """
        compute = (self.flops_per_token * tokens + self.attn_flops * attn_context) / self.flops_rate
        memory = (self.weights + self.kv_bytes * (context_read + tokens)) / self.bytes_rate
        comm = self.comm_fixed + self.comm_per_token * tokens if self.tp > 1 else 0.0
        return max(compute, memory), compute, memory, comm

    def decode_run(self, batch: int, context: int, steps: int
                   ) -> tuple[float, float, float, float]:
        """``steps`` decode steps of ``batch`` sequences holding ``context`` KV tokens in all
        at the first step (each step adds ``batch``).

        Returns:
            (kernel_s, compute_s, memory_s, comm_s) summed over the steps, kernel time exact
            for the piecewise-linear max of compute and memory.
        """
        a_c = (self.flops_per_token * batch + self.attn_flops * context) / self.flops_rate
        b_c = self.attn_flops * batch / self.flops_rate
        a_m = (self.weights + self.kv_bytes * (context + batch)) / self.bytes_rate
        b_m = self.kv_bytes * batch / self.bytes_rate
        n = steps
        tri = n * (n - 1) / 2.0
        compute, memory = a_c * n + b_c * tri, a_m * n + b_m * tri
        kernel = _sum_max(a_c, b_c, a_m, b_m, n)
        comm = (self.comm_fixed + self.comm_per_token * batch) * n if self.tp > 1 else 0.0
        return kernel, compute, memory, comm


def _sum_max(a1: float, b1: float, a2: float, b2: float, n: int) -> float:
    """sum_{i<n} max(a1 + b1 i, a2 + b2 i) for lines crossing at most once."""
    def total(a: float, b: float, lo: int, hi: int) -> float:
        count = hi - lo
        return a * count + b * (hi * (hi - 1) - lo * (lo - 1)) / 2.0 if count > 0 else 0.0

    if b1 == b2:
        return total(max(a1, a2), b1, 0, n)
    cross = (a2 - a1) / (b1 - b2)  # line 1 above line 2 for i > cross when b1 > b2
    split = 0 if cross < 0 else n if cross >= n else int(cross) + 1
    if b1 > b2:
        return total(a2, b2, 0, split) + total(a1, b1, split, n)
    return total(a1, b1, 0, split) + total(a2, b2, split, n)
