"""Replay recorded arrivals through the engine model with step times measured on a fleet.

The simulator's :class:`~simulator.engine.Instance` (continuous batching, chunked prefill,
paged KV blocks, preemption) normally times its steps with the roofline of a GPU preset
(:class:`~simulator.roofline.StepModel`). :class:`MeasuredSteps` times them with curves a
fleet measured instead (fleetlens' capacity fit): a step that only decodes ``d`` sequences
holding ``C`` KV tokens takes ``decode(d, C) = base + per_seq x d + per_kv x C + above x
max(0, d - hinge)``; one that also computes prompt tokens, the larger of that and
``prefill_base + prefill_per_token x tokens`` (the roofline's shape: the prompt's compute
hides the weights' read it shares with the decodes), plus ``wake`` where it starts on an
idle engine (a CPU engine's threads wake: measured by the twin's calibration). It has the
roofline model's interface, so the engine runs unchanged. :func:`replay` feeds requests
(arrival, prompt and output tokens) to ``instances`` engines, routed uniformly at random as
the fleet's router does, and returns each request's latencies and each engine's busy time.
Prefix caching is off: the requests carry no block hashes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fleetlens.simulator.engine import Instance
from fleetlens.simulator.power import GpuState
from fleetlens.simulator.scenario import Deployment
from fleetlens.simulator.specs import GPU_PRESETS, MODEL_PRESETS
from fleetlens.simulator.workload import Request

#: seconds the engines may run past the last arrival to finish what they hold
DRAIN_S = 3600.0


@dataclass
class MeasuredSteps:
    """Step times from measured curves (module docstring); every second is GPU-busy time
    (the measured steps include the CPU's share, which NVML counts busy as well)."""

    base_s: float
    per_seq_s: float
    per_kv_s: float
    prefill_base_s: float
    prefill_per_token_s: float
    hinge: float = float("inf")
    above_s: float = 0.0
    #: what a step started on an idle engine takes more (a CPU engine's threads wake)
    wake_s: float = 0.0

    def __post_init__(self) -> None:
        self.step_overhead = 0.0
        self.instance: Instance | None = None
        # per request (by its ``seq``): how much slower than the curves its decode and its
        # prompt ran where measured (the host's own variation); empty: 1
        self.decode_scale: Sequence[float] = ()
        self.prefill_scale: Sequence[float] = ()

    def retune(self, clock: float, perf: float, link_slowdown: float,
               extra_overhead_s: float) -> None:
        """Clocks and faults do not change measured curves (the engine calls this)."""

    def _decode(self, batch: float, context: float) -> float:
        return (self.base_s + self.per_seq_s * batch + self.per_kv_s * context
                + self.above_s * max(0.0, batch - self.hinge))

    def _decoding(self) -> tuple[int, float, float]:
        """Sequences of the step being scheduled that decode one token (their KV holds all
        but the token sampled last; the rest compute prompt or recompute tokens), and the
        mean scale of those decoding and of those computing prompt tokens: a step runs as
        slow as the requests it carries ran."""
        running = self.instance.running if self.instance else []
        d = prompts = 0
        d_scale = p_scale = 0.0
        for r in running:
            if r.prompt_len + r.generated - r.computed == 1:
                d += 1
                d_scale += self.decode_scale[r.seq] if self.decode_scale else 1.0
            else:
                prompts += 1
                p_scale += self.prefill_scale[r.seq] if self.prefill_scale else 1.0
        return d, d_scale / d if d else 1.0, p_scale / prompts if prompts else 1.0

    def _from_idle(self) -> bool:
        """Whether the step being scheduled starts on an idle engine: nothing it carries
        has computed a token yet (every request was admitted into this step)."""
        running = self.instance.running if self.instance else []
        return bool(running) and all(r.computed == 0 and r.generated == 0 for r in running)

    def step(self, tokens: int, context_read: int, attn_context: float
             ) -> tuple[float, float, float, float]:
        """One step (the roofline model's signature): (busy s, 0, busy s, 0)."""
        decoding, d_scale, p_scale = self._decoding()
        d = min(decoding, tokens)
        t = self._decode(d, context_read) * d_scale if d else 0.0
        if tokens > d:
            t = max(t, (self.prefill_base_s + self.prefill_per_token_s * tokens) * p_scale)
        if self.wake_s and self._from_idle():
            t += self.wake_s
        return t, 0.0, t, 0.0

    def decode_run(self, batch: int, context: int, steps: int
                   ) -> tuple[float, float, float, float]:
        """``steps`` decode steps of ``batch`` sequences, the KV growing ``batch`` a step."""
        grown = self.per_kv_s * batch * steps * (steps - 1) / 2.0
        scale = self._decoding()[1]
        t = (self._decode(batch, context) * steps + grown) * scale
        return t, 0.0, t, 0.0


@dataclass(frozen=True)
class Arrival:
    """One recorded request: when it arrived (ns) and its token counts."""

    arrival_ns: int
    prompt: int
    output: int


@dataclass(frozen=True)
class Replayed:
    """One replayed request's latencies, s (``tpot_s`` None for a one-token answer)."""

    arrival_ns: int
    output: int
    ttft_s: float
    tpot_s: float | None
    e2e_s: float
    queue_s: float = 0.0  # in the engine's queue: reached it to first scheduled
    prefill_s: float = 0.0  # first scheduled to first token


def _engine(index: int, steps: MeasuredSteps, max_num_seqs: int, max_batched_tokens: int,
            kv_blocks: int, start_ns: int) -> Instance:
    # The preset model and GPU only build the roofline model the measured steps replace, and
    # the power model, which the twin does not read.
    deployment = Deployment("twin", MODEL_PRESETS["llama-3.1-8b"], ("twin",),
                            max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=max_batched_tokens,
                            prefix_caching=False, kv_blocks=kv_blocks)
    gpu = GpuState(GPU_PRESETS["H100-SXM"], "twin", index, f"twin-{index}")
    engine = Instance(f"twin/{index}", deployment, "twin", [gpu], kv_blocks, start_ns)
    engine.steps = steps
    steps.instance = engine
    return engine


def _requests(arrivals: list[Arrival], engines: int, seed: int) -> list[list[Request]]:
    rng = random.Random(seed)
    routed: list[list[Request]] = [[] for _ in range(engines)]
    for seq, a in enumerate(arrivals):
        r = Request()
        r.seq, r.rid, r.service = seq, str(seq), "twin"
        r.client_ns = r.engine_ns = a.arrival_ns
        r.prompt_len, r.out_target, r.max_tokens = max(a.prompt, 1), max(a.output, 1), a.output
        r.prefix_key, r.prefix_blocks = None, 0
        routed[min(int(rng.random() * engines), engines - 1)].append(r)
    return routed


def replay(arrivals: list[Arrival], engines: int, steps: MeasuredSteps, *,
           max_num_seqs: int, max_batched_tokens: int, kv_blocks: int,
           seed: int = 0, outside_s: Sequence[float] = (),
           decode_scale: Sequence[float] = (), prefill_scale: Sequence[float] = ()
           ) -> tuple[list[Replayed], list[float]]:
    """Run ``arrivals`` through ``engines`` engines timed by copies of ``steps``.
    Per arrival, where given: ``outside_s``, the time it spends outside the engine before
    it reaches the engine's queue (measured; in place of the simulator's API-server
    constants); ``decode_scale`` and ``prefill_scale``, how much slower than the curves its
    decode and its prompt ran when measured (a step runs as slow as the mean of those it
    carries: the host's own variation, which the curves' means leave out).

    Returns:
        (each request's latencies in arrival order, each engine's busy seconds).
    """
    if not arrivals:
        return [], [0.0] * engines
    start = min(a.arrival_ns for a in arrivals)
    until = (max(a.arrival_ns for a in arrivals) - start) / 1e9 + DRAIN_S
    done: list[Replayed] = []
    busy: list[float] = []
    for i, requests in enumerate(_requests(arrivals, engines, seed)):
        own = MeasuredSteps(steps.base_s, steps.per_seq_s, steps.per_kv_s,
                            steps.prefill_base_s, steps.prefill_per_token_s, steps.hinge,
                            steps.above_s, steps.wake_s)
        own.decode_scale, own.prefill_scale = decode_scale, prefill_scale
        engine = _engine(i, own, max_num_seqs, max_batched_tokens, kv_blocks, start)
        engine.enqueue(requests)
        if outside_s:
            for r in engine.pending:
                r.queued_t = (r.engine_ns - start) / 1e9 + outside_s[r.seq]
            engine.pending.sort(key=lambda r: r.queued_t)
        engine.advance(until)
        busy.append(engine.gpus[0].busy_s)
        for r in engine.finished:
            arrived = (r.engine_ns - start) / 1e9
            tpot = ((r.last_token_t - r.first_token_t) / (r.generated - 1)
                    if r.generated > 1 else None)
            done.append(Replayed(r.engine_ns, r.generated, r.first_token_t - arrived, tpot,
                                 r.finish_t - arrived, r.scheduled_t - r.queued_t,
                                 r.first_token_t - r.scheduled_t))
    done.sort(key=lambda x: x.arrival_ns)
    return done, busy
