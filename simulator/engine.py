"""One vLLM-like instance: a continuous-batching scheduler over a paged KV cache.

Each step (vLLM V1 semantics) gives every running request its next tokens within the token
budget ``max_num_batched_tokens``: one token for a decoding request, a chunk of the prompt for
one still in prefill (chunked prefill); then admits waiting requests first come first served
while seats (``max_num_seqs``), budget and KV blocks allow, reusing cached prefix blocks.
When a running request needs a block and none is free, the most recently admitted request is
preempted: its blocks are freed and it is recomputed later from scratch (prompt plus the
tokens it had generated). A step that brings a request's KV up to all its known tokens
samples one new token.

Stretches where every running request is decoding and nothing can change the batch are
simulated as one *decode run* of k identical-batch steps with a closed-form sum of step
times, which is what makes an hour of a 64-GPU fleet take seconds.
"""

from __future__ import annotations

import math
from collections import deque

from fleetlens.simulator.kvcache import BlockPool
from fleetlens.simulator.power import GpuState, activity
from fleetlens.simulator.roofline import StepModel
from fleetlens.simulator.scenario import Deployment
from fleetlens.simulator.specs import BLOCK_TOKENS
from fleetlens.simulator.workload import Request

#: API-server time before a request reaches the engine queue, and after its last token.
TOKENIZE_S, TOKENIZE_PER_TOKEN_S, DETOKENIZE_S = 0.0005, 1e-6, 0.001


class Instance:
    """One engine serving ``deployment`` on ``gpus`` (its tensor-parallel group)."""

    def __init__(self, instance_id: str, deployment: Deployment, host: str,
                 gpus: list[GpuState], kv_blocks: int, start_ns: int) -> None:
        self.start_ns = start_ns
        self.id, self.deployment, self.host, self.gpus = instance_id, deployment, host, gpus
        d = deployment
        self.max_seqs, self.budget = d.max_num_seqs, d.max_num_batched_tokens
        self.pool = BlockPool(kv_blocks, d.prefix_caching)
        self.steps = StepModel(d.model, gpus[0].spec, d.tp, d.mfu, d.bandwidth_efficiency,
                               d.step_overhead_ms / 1000.0)
        self.pending: list[Request] = []  # routed, not yet in the engine queue
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.now = 0.0
        self.blocked = False  # head of the queue did not fit; retry once blocks are freed
        self.prefilling = False  # a running request still has prompt tokens to compute
        # incident modifiers (simulator.incidents)
        self.extra_overhead_s = 0.0
        self.link_slowdown = 1.0
        self.prefix_cache_off = False
        # failure state (simulator.failures): a dead or hung engine takes no step
        self.down = self.hung = self.stalled = False
        self.down_since = 0.0  # virtual time of the last crash
        self.process_start_s = start_ns / 1e9  # set by the fleet, renewed at a restart
        # cumulative counters, as vLLM's /metrics
        self.preemptions = self.prefix_queries = self.prefix_hits = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.retune()

    def retune(self) -> None:
        """Refresh step-time constants from the group's slowest GPU and the modifiers."""
        self.steps.retune(min(g.clock for g in self.gpus), min(g.perf for g in self.gpus),
                          self.link_slowdown, self.extra_overhead_s)

    # --- requests in ----------------------------------------------------------------------
    def enqueue(self, requests: list[Request]) -> None:
        """Route requests here; each reaches the queue after the API server's tokenization."""
        pre, start = TOKENIZE_S + self.extra_overhead_s, self.start_ns
        for r in requests:
            r.queued_t = (r.engine_ns - start) / 1e9 + pre + TOKENIZE_PER_TOKEN_S * r.prompt_len
            r.post_s = DETOKENIZE_S + self.extra_overhead_s
        self.pending.extend(requests)
        self.pending.sort(key=lambda r: r.queued_t)

    def _arrive(self) -> None:
        pending, now = self.pending, self.now
        if pending and pending[0].queued_t <= now:
            i = 0
            while i < len(pending) and pending[i].queued_t <= now:
                i += 1
            self.waiting.extend(pending[:i])
            del pending[:i]

    def num_waiting(self, at: float) -> int:
        """Requests in the queue at ``at`` (vLLM's num_requests_waiting)."""
        return len(self.waiting) + sum(1 for r in self.pending if r.queued_t <= at)

    # --- the loop -------------------------------------------------------------------------
    def advance(self, until: float) -> None:
        """Run steps until the engine clock reaches ``until`` (the last step may end after)."""
        while True:
            self._arrive()
            now = self.now
            if now >= until:
                return
            if self.stalled:  # down or hung: no step, the GPUs idle
                self._idle(until - now)
                continue
            running, waiting = self.running, self.waiting
            if (waiting and not self.blocked and len(running) < self.max_seqs) or self.prefilling:
                if self._step():
                    continue
            elif running:
                self._decode_run(until)
                continue
            # nothing can run: wait for the next arrival (or the tick's end, when incidents
            # may give KV blocks back), then try the queue again
            nxt = self.pending[0].queued_t if self.pending else until
            self._idle(min(nxt, until) - now)
            self.blocked = False

    def _idle(self, seconds: float) -> None:
        if seconds > 0:
            for g in self.gpus:
                g.idle(seconds)
            self.now += seconds

    # --- one detailed step ----------------------------------------------------------------
    def _step(self) -> bool:
        budget, running = self.budget, self.running
        sched: list[tuple[Request, int]] = []
        tokens = context = 0
        attn = 0.0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.prompt_len + r.generated - r.computed, budget)
            if not self._grow(r, r.computed + n):
                preempted = True
                victim = None
                while victim is not r:
                    victim = running[-1]
                    self._preempt(victim)
                    if victim is not r and self._grow(r, r.computed + n):
                        break
                if victim is r:
                    continue
            sched.append((r, n))
            budget -= n
            tokens += n
            context += r.computed
            attn += n * r.computed + n * (n + 1) / 2.0
            i += 1
        if not preempted:
            while self.waiting and len(running) < self.max_seqs and budget > 0:
                at = self._admissible()
                if at < 0:
                    self.blocked = True
                    break
                r = self.waiting[at]
                n = self._admit(r, budget)
                if n == 0:
                    self.blocked = True
                    break
                del self.waiting[at]
                running.append(r)
                sched.append((r, n))
                budget -= n
                tokens += n
                context += r.computed
                attn += n * r.computed + n * (n + 1) / 2.0
        if not sched:
            return False
        kernel, compute, memory, comm = self.steps.step(tokens, context, attn)
        overhead = self.steps.step_overhead
        self._spend(kernel, compute, memory, comm, overhead)
        end = self.now + overhead + kernel + comm
        self.now = end
        done = []
        prefilling = False
        for r, n in sched:
            r.computed += n
            if r.computed >= r.prompt_len + r.generated:
                if r.first_token_t < 0:
                    r.first_token_t = end
                    self.prompt_tokens += r.prompt_len
                r.generated += 1
                self.generation_tokens += 1
                r.last_token_t = end
                if r.generated >= r.out_target:
                    done.append(r)
            else:
                prefilling = True
        # requests preempted or not scheduled this step (budget) may still be in prefill
        self.prefilling = prefilling or len(sched) < len(running)
        for r in done:
            self._finish(r)
        return True

    def _admissible(self) -> int:
        """Index of the first waiting request whose whole sequence fits the usable cache (-1
        if none). vLLM refuses to start with a cache smaller than one ``max_model_len``
        sequence, so there every request can run once blocks are free; a kv_cache_pressure
        incident here can shrink the cache below a long request. Such a request waits aside
        until blocks come back (first come, first served among the rest): were it left at
        the head, the engine would idle the whole incident, its GPUs at idle power and clock
        with hundreds waiting, where a real engine with a full cache runs the batch it holds.
        """
        usable = self.pool.usable * BLOCK_TOKENS
        for i, r in enumerate(self.waiting):
            if r.prompt_len + r.out_target <= usable:
                return i
        return -1

    def _admit(self, r: Request, budget: int) -> int:
        """Try to start ``r``: prefix-cache lookup and blocks for its first chunk; returns the
        chunk size, 0 when the blocks are not there."""
        keys = [] if self.prefix_cache_off or not self.pool.prefix_caching else r.block_keys()
        known = r.prompt_len + r.generated
        hit_blocks = self.pool.lookup(keys)
        # at least one token must be computed to sample from
        hit = min(hit_blocks * BLOCK_TOKENS, (known - 1) // BLOCK_TOKENS * BLOCK_TOKENS)
        n = min(known - hit, budget)
        need = -(-(hit + n) // BLOCK_TOKENS)
        hashed = keys[:need]
        if not self.pool.acquire(hashed, need - len(hashed)):
            return 0
        r.hashed, r.plain, r.computed = hashed, need - len(hashed), hit
        r.capacity = need * BLOCK_TOKENS
        self.prefix_queries += known
        self.prefix_hits += hit
        if r.scheduled_t < 0:
            r.scheduled_t = self.now
        return n

    def _grow(self, r: Request, tokens: int) -> bool:
        """Make ``r`` hold enough blocks for ``tokens`` KV tokens (plain blocks)."""
        if tokens <= r.capacity:
            return True
        need = -(-(tokens - r.capacity) // BLOCK_TOKENS)
        if not self.pool.acquire_plain(need):
            return False
        r.plain += need
        r.capacity += need * BLOCK_TOKENS
        return True

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self.pool.release(r.hashed, r.plain)
        r.hashed, r.plain, r.capacity, r.computed = [], 0, 0, 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)
        self.blocked = False

    def _finish(self, r: Request) -> None:
        self.running.remove(r)
        self.pool.release(r.hashed, r.plain)
        r.hashed, r.plain, r.capacity = [], 0, 0
        r.finish_t = r.last_token_t + r.post_s
        self.finished.append(r)
        self.blocked = False

    # --- many identical decode steps at once ------------------------------------------------
    def _decode_run(self, until: float) -> None:
        running = self.running
        batch = len(running)
        remaining = slack = 1 << 62
        context = 0
        for r in running:  # one pass: tokens left, free slots in the last block, KV held
            computed = r.computed
            context += computed
            left = r.out_target - r.generated
            if left < remaining:
                remaining = left
            room = r.capacity - computed
            if room < slack:
                slack = room
        free = self.pool.free
        # k steps need at most ceil((k - slack) / 16) new blocks per request
        by_blocks = BLOCK_TOKENS * (free // batch) + max(slack, 0) if free >= batch else slack
        if by_blocks <= 0:
            self._step()  # allocation or preemption needed: do it exactly
            return
        first = self.steps.step(batch, context, float(context))
        step_s = self.steps.step_overhead + first[0] + first[3]
        horizon = until
        if self.pending and len(running) < self.max_seqs and not self.blocked:
            horizon = min(horizon, self.pending[0].queued_t)
        by_time = max(1, math.ceil((horizon - self.now) / step_s))
        k = max(1, min(remaining, by_blocks, by_time))
        kernel, compute, memory, comm = self.steps.decode_run(batch, context, k)
        overhead = self.steps.step_overhead * k
        self._spend(kernel, compute, memory, comm, overhead)
        end = self.now + overhead + kernel + comm
        self.now = end
        self.generation_tokens += batch * k
        done = []
        grown = 0
        for r in running:
            computed = r.computed + k
            r.computed = computed
            r.generated += k
            if computed > r.capacity:
                need = -(-(computed - r.capacity) // BLOCK_TOKENS)
                r.plain += need
                r.capacity += need * BLOCK_TOKENS
                grown += need
            r.last_token_t = end
            if r.generated >= r.out_target:
                done.append(r)
        if grown:
            self.pool.acquire_plain(grown)  # by_blocks guarantees the room
        for r in done:
            self._finish(r)

    def _spend(self, kernel: float, compute: float, memory: float, comm: float,
               overhead: float) -> None:
        """Charge a step's (or run's) time to every GPU of the group; faster GPUs of a
        heterogeneous group wait for the slowest in the collective."""
        if kernel <= 0:
            return
        c_share, m_share = min(compute / kernel, 1.0), min(memory / kernel, 1.0)
        act = activity(c_share, m_share)
        gpus = self.gpus
        if len(gpus) == 1:
            gpus[0].spend(kernel, act, m_share, comm, overhead)
            return
        slowest = min(g.clock * g.perf for g in gpus)
        for g in gpus:
            own = kernel * slowest / (g.clock * g.perf)
            g.spend(own, act, m_share, comm + kernel - own, overhead)
