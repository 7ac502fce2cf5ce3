"""Arrival processes: one :class:`Stream` per ``[[workload]]``, asked tick by tick."""

from __future__ import annotations

import math
import random
from pathlib import Path

from fleetlens.simulator.scenario import ScenarioError, Workload
from fleetlens.simulator.specs import BLOCK_TOKENS
from fleetlens.simulator.workload import Request, read_azure, read_mooncake, sample_length

DAY_S = 86_400.0


class Stream:
    """Requests of one workload.

    Args:
        workload: the ``[[workload]]`` table.
        index: its position in the scenario (names its random generators).
        seed: the run's seed.
        start_ns: virtual time zero, ns since the epoch.
        duration_s: no arrivals at or after this offset.
        base_dir: where relative replay paths are resolved.
    """

    def __init__(self, workload: Workload, index: int, seed: int, start_ns: int,
                 duration_s: float, base_dir: Path) -> None:
        self.w = workload
        self.start_ns, self.duration_s = start_ns, duration_s
        self.rng = random.Random(f"{seed}:{index}:requests")
        self.seq = 0
        # incident modifiers, set by simulator.incidents
        self.rate_multiplier = 1.0
        self.prompt_multiplier = 1.0
        self.prefix_break_share = 0.0
        self.rows: list = []
        self.cursor = 0
        if workload.replay:
            path = Path(workload.replay)
            path = path if path.is_absolute() else base_dir / path
            if not path.exists():
                raise ScenarioError(
                    f"[[workload]] {workload.service}: replay file {path} not found")
            self.rows = read_azure(path) if workload.format == "azure" else read_mooncake(path)
        self.bursts = self._bursts(random.Random(f"{seed}:{index}:bursts"))

    def _bursts(self, rng: random.Random) -> list[tuple[float, float]]:
        spans, t = [], 0.0
        per_s = self.w.bursts_per_hour / 3600.0
        while per_s > 0:
            t += rng.expovariate(per_s)
            if t >= self.duration_s:
                break
            spans.append((t, t + self.w.burst_duration_s))
        return spans

    def rate(self, t: float) -> float:
        """Arrival rate (req/s) at virtual offset ``t``: base x daily cosine x bursts x surge."""
        w = self.w
        rate = w.rate * self.rate_multiplier
        if w.daily_amplitude:
            hour = ((self.start_ns / 1e9 + t) % DAY_S) / 3600.0
            rate *= 1.0 + w.daily_amplitude * math.cos(2 * math.pi * (hour - w.peak_hour) / 24)
        if any(a <= t < b for a, b in self.bursts):
            rate *= w.burst_factor
        return rate

    def until(self, t0: float, t1: float) -> list[Request]:
        """Requests arriving in [t0, t1) (virtual seconds), in arrival order."""
        t1 = min(t1, self.duration_s)
        if t0 >= t1:
            return []
        if self.rows:
            return self._replay(t1)
        out, rng = [], self.rng
        rate = self.rate(t0)
        t = t0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= t1:
                break
            client_ns = self.start_ns + round(t * 1e9)
            out.append(self._make(client_ns, sample_length(self.w.prompt, rng),
                                  sample_length(self.w.output, rng), None))
        return out

    def _replay(self, t1: float) -> list[Request]:
        out, rows, limit = [], self.rows, round(t1 * 1e9)
        scale = self.w.time_scale
        while self.cursor < len(rows):
            offset, prompt, output, hashes = rows[self.cursor]
            offset = offset if scale == 1.0 else round(offset * scale)
            if offset >= limit:
                break
            self.cursor += 1
            out.append(self._make(self.start_ns + offset, prompt, output, hashes, replay=True))
        return out

    def _make(self, client_ns: int, prompt: int, output: int, hashes: list[int] | None,
              replay: bool = False) -> Request:
        w, rng = self.w, self.rng
        r = Request()
        r.seq = self.seq
        self.seq += 1
        r.service, r.gateway = w.service, w.gateway_service
        r.client_ns = client_ns
        r.prompt_len = max(1, int(prompt * self.prompt_multiplier))
        if replay:
            r.out_target, r.max_tokens = max(output, 1), max(output, w.max_tokens)
        else:
            r.out_target, r.max_tokens = max(1, min(output, w.max_tokens)), w.max_tokens
        r.temperature, r.top_p = w.temperature, w.top_p
        r.hash_ids = hashes
        # fixed draws per request, whatever the incidents: shared prefix, broken prefix,
        # gateway, route, ids
        shared, group, broken = rng.random(), rng.random(), rng.random()
        via_gateway, route = rng.random(), rng.random()
        r.prefix_key, r.prefix_blocks = None, 0
        if hashes is None and w.prefix_groups and w.prefix_tokens and shared < w.prefix_share:
            if broken < self.prefix_break_share:
                r.prefix_key = (w.service, "unique", r.seq)
            else:
                r.prefix_key = (w.service, int(group * w.prefix_groups))
            r.prefix_blocks = min(w.prefix_tokens, r.prompt_len - 1) // BLOCK_TOKENS
        r.trace = rng.getrandbits(128) or 1
        r.span = rng.getrandbits(64) or 1
        gateway_span = rng.getrandbits(64) or 1
        r.gateway_span_id = gateway_span if via_gateway < w.gateway_share else 0
        r.rid = f"cmpl-{rng.getrandbits(128):032x}-0"
        r.instance = route  # a uniform draw; the fleet maps it to an instance
        return r
