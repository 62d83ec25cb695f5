"""Load or compute: whether a prefix an engine finds in kvtier is cheaper to load than to
compute again, from the engine's own measurements.

A tier is worth using only where reading a block costs less than computing its tokens.
That holds by a wide margin for most models and machines (a block's bytes against a
forward pass over its tokens), but not for every one: a small model on a fast
accelerator computes a short prefix in less time than a slow disk returns it, and a
machine under load can make either side slower. So the engine measures both, as it runs:

- a load: its time (lookup done; acquire, copy into the engine's pages, release) and its
  blocks;
- a step: its forward time less the loads in it, and the tokens it computed, for steps of
  at least ``min_step_tokens`` tokens (prefill-sized: a decode step's time is mostly fixed
  cost, not per token).

The estimates are medians over the last ``window`` samples of each (seconds per loaded
block, seconds per computed token), so one slow load or step does not move them. A load
of ``n`` blocks covering ``t`` tokens goes ahead when ``n * per_block < t * per_token *
margin``, or while either side has fewer than ``min_samples`` samples. A load the
estimates decline is computed by the engine; every ``probe_every``-th declined load goes
ahead anyway, so that the load side keeps being measured and the decision follows the
machine when it changes.

The per-token cost is a mean over the steps measured; attention makes a long prompt's
tokens dearer than a short one's, so for long prompts the rule errs towards loading.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Optional


class LoadCost:
    def __init__(self, window: int = 64, min_samples: int = 4, probe_every: int = 16, margin: float = 1.0,
                 min_step_tokens: int = 64):
        if window < 1 or min_samples < 1 or probe_every < 1 or margin <= 0 or min_step_tokens < 1:
            raise ValueError("LoadCost: window, min_samples, probe_every and min_step_tokens must be at least 1, "
                             "margin above 0")
        self.min_samples, self.probe_every, self.margin = min_samples, probe_every, margin
        self.min_step_tokens = min_step_tokens
        self._per_block: deque = deque(maxlen=window)
        self._per_token: deque = deque(maxlen=window)
        self.declined = 0   # loads declined (the engine computed them)
        self.probes = 0     # loads that went ahead although the estimates declined them
        self.loads_seen = 0  # measurements taken in, all time
        self.steps_seen = 0

    def add_load(self, seconds: float, blocks: int) -> None:
        """One complete load of `blocks` blocks that took `seconds`."""
        if blocks > 0 and seconds >= 0:
            self._per_block.append(seconds / blocks)
            self.loads_seen += 1

    def add_step(self, seconds: float, tokens: int) -> None:
        """One forward step that computed `tokens` tokens in `seconds` (its loads not counted)."""
        if tokens >= self.min_step_tokens and seconds > 0:
            self._per_token.append(seconds / tokens)
            self.steps_seen += 1

    def seconds_per_block(self) -> Optional[float]:
        return statistics.median(self._per_block) if len(self._per_block) >= self.min_samples else None

    def seconds_per_token(self) -> Optional[float]:
        return statistics.median(self._per_token) if len(self._per_token) >= self.min_samples else None

    def latest(self):
        """(seconds per block of the last load, seconds per token of the last step) taken in;
        None for a side with none yet."""
        return (self._per_block[-1] if self._per_block else None,
                self._per_token[-1] if self._per_token else None)

    def estimate(self, blocks: int, tokens: int):
        """(load seconds, compute seconds) for a prefix of `blocks` blocks and `tokens`
        tokens; None for a side with too few samples yet."""
        b, t = self.seconds_per_block(), self.seconds_per_token()
        return (None if b is None else blocks * b), (None if t is None else tokens * t)

    def worth_loading(self, blocks: int, tokens: int) -> bool:
        """True: load the prefix. False: let the engine compute it (counted in `declined`)."""
        load, compute = self.estimate(blocks, tokens)
        if load is None or compute is None or load < compute * self.margin:
            return True
        self.declined += 1
        if self.declined % self.probe_every == 0:
            self.probes += 1
            return True
        return False
