"""One vLLM engine's scheduler, simulated step by step (vLLM v1 `Scheduler.schedule`, 0.26 and 0.32 alike):

- continuous batching under a token budget (`--max-num-batched-tokens`) and a cap on requests running
  (`--max-num-seqs`); chunked prefill: a prompt longer than the budget left runs in chunks, one a step;
- running requests are scheduled first, in order (a decode takes 1 token, an unfinished prefill its next chunk),
  then waiting ones first come first served while budget, seats and blocks last;
- blocks: a request holds, per KV cache group, the blocks its tokens fill, and one state block per GDN group
  (core/layout/capacity.py `blocks_per_request`): the pool's size caps how many requests run at once. A running
  request that cannot get its next block preempts the last one running (vLLM: `self.running.pop()`), which loses
  its KV and computes again from its prompt (recompute preemption);
- P/D's decode side: a request whose prompt comes over NIXL takes its blocks when first scheduled and waits for
  the READ outside the batch (WAITING_FOR_REMOTE_KVS); once loaded it computes the one token it lacks and decodes.
Not modelled: prefix caching (off in launch), async scheduling's overlap (in the measured step time), speculative
decoding, priorities.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridserve.core.sizing.step_profile import EngineLimits, StepCoefficients


@dataclass(eq=False, kw_only=True)
class Job:
    """One request's work on one engine: hold `prompt_tokens`, then sample `max_new` tokens."""

    rid: int
    prompt_tokens: int
    max_new: int
    remote_tokens: int = 0  # of the prompt, read over NIXL (P/D decode side); 0: computed here
    is_holding: bool = False  # keep the blocks once done, until released (P/D prefill side: until decode's READ)
    computed: int = 0
    sampled: int = 0
    blocks: int = 0
    state: str = "new"  # new, loading (READ in flight), ready
    token_times: list[float] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        """Tokens to compute before the next sample."""
        return self.prompt_tokens + self.sampled - self.computed


StartTransfer = Callable[[Job, float], None]  # (job, now): the engine asks for its READ


class Engine:
    def __init__(self, name: str, coefficients: StepCoefficients, limits: EngineLimits, num_blocks: int,
                 blocks_for: Callable[[int], int]) -> None:
        self.name, self.coefficients, self.limits = name, coefficients, limits
        self.free_blocks, self.blocks_for = num_blocks, blocks_for
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.is_busy = False
        self.is_kicked = False  # a step start is due (simulate.py)
        self.num_preemptions = 0
        self.num_loading = 0  # waiting jobs whose READ is in flight
        self.on_transfer: StartTransfer | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > self.num_loading

    def schedule(self, now: float) -> tuple[float, list[tuple[Job, int, int]]]:
        """The next step's batch, (job, new tokens, tokens before), and its duration; an empty batch: nothing to
        run now."""
        budget, batch = self.limits.max_num_batched_tokens, []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            job = self.running[index]
            count = min(job.remaining, budget)
            while not self._grow(job, job.computed + count):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is job:
                    break
            else:
                batch.append((job, count, job.computed))
                budget -= count
                index += 1
                continue
            break
        if not preempted:
            budget = self._admit(now, budget, batch)
        if not batch:
            return 0.0, batch
        tokens, pairs = 0, 0.0
        for _, n, before in batch:
            tokens += n
            pairs += n * before + n * (n + 1) / 2
        return self.coefficients.step_s(num_tokens=tokens, num_seqs=len(batch), attention_pairs=pairs), batch

    def _admit(self, now: float, budget: int, batch: list) -> int:
        skipped: list[Job] = []
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            job = self.waiting.popleft()
            if job.state == "loading":
                skipped.append(job)
                continue
            if job.remote_tokens and job.state == "new":  # blocks now, READ in flight outside the batch
                if not self._grow(job, job.remote_tokens + 1):
                    self.waiting.appendleft(job)
                    break
                job.state = "loading"
                self.num_loading += 1
                skipped.append(job)
                if self.on_transfer is not None:
                    self.on_transfer(job, now)
                continue
            count = min(job.remaining, budget)
            if not self._grow(job, job.computed + count):
                self.waiting.appendleft(job)
                break
            self.running.append(job)
            batch.append((job, count, job.computed))
            budget -= count
        self.waiting.extendleft(reversed(skipped))
        return budget

    def loaded(self, job: Job) -> None:
        """The READ is done: the prompt's KV is here; the job waits for a seat to compute its last token."""
        job.state, job.computed = "ready", job.remote_tokens
        self.num_loading -= 1

    def finish_step(self, now: float, batch: list[tuple[Job, int, int]]) -> list[Job]:
        """Apply a finished step; return the jobs that sampled their last token."""
        done = []
        for job, count, _ in batch:
            job.computed += count
            if job.remaining == 0:
                job.sampled += 1
                job.token_times.append(now)
                if job.sampled >= job.max_new:
                    done.append(job)
        for job in done:
            self.running.remove(job)
            if not job.is_holding:
                self.release(job)
        return done

    def release(self, job: Job) -> None:
        self.free_blocks += job.blocks
        job.blocks = 0

    def _grow(self, job: Job, tokens: int) -> bool:
        need = self.blocks_for(tokens) - job.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        job.blocks += need
        return True

    def _preempt(self, job: Job) -> None:
        """Recompute preemption: the blocks go back, the job starts again from its prompt (and what it sampled)."""
        self.release(job)
        job.computed, job.remote_tokens, job.state = 0, 0, "ready"
        self.waiting.appendleft(job)
        self.num_preemptions += 1
