"""Inside the training loader's batches (issue 35.2, 35.3): slow samples, what in-order delivery costs,
and where the loop's wait for a batch goes.

Each step of a torch DataLoader iterator with ``num_workers`` workers and in-order delivery (the
default) is the batch of worker ``i % num_workers``, its ``i // num_workers``-th (torch sends indices
round-robin, ``_worker_queue_idx_cycle``). So each step's batch is matched to its worker's fetch row:
when it was made (``t_start``, ``t_end``), and from ``batch_parts`` its samples' and collate's time.
The match is checked (a batch delivered before its worker finished it means the match is wrong) and
dropped where it fails. Only an iterator's first epoch is matched (a persistent iterator's next epoch
restarts the cycle).

For each matched step with a wait ``[t_request, t_deliver]``:

- **made in the worker**: the part of the wait before its batch's fetch ended (the worker making it,
  or still busy with its earlier batches), split between reading samples and collating by its parts;
- **in order**: of that, the time during which a later batch (one in flight, up to ``num_workers ×
  prefetch_factor`` ahead) was already made: with ``in_order=False`` torch would have handed that
  one over instead (head-of-line blocking; MinatoLoader, EuroSys 2026);
- **hand-over**: after its fetch ended (the batch in the worker's queue, pickled, received, unpickled
  from shared memory, the pin thread busy with another batch), less its pinning;
- **pinning**: with ``pin_memory``, the part of the wait while its own batch was being pinned (its
  ``pins`` row). The pin thread pins batches in the order they come from the workers: the first
  epoch's batches in the order their fetches ended are matched to its rows in order, and the match is
  checked like the worker match (a batch pinned before it was made, or delivered before it was
  pinned, is a wrong match). With ``num_workers=0`` the batch is pinned inside ``next()``: the row
  inside the step's wait, and the rest of the wait is the batch made there. None (N/A) where no row
  was matched: nothing pinned (a CPU-only torch pins nothing), or the match failed.

Slow samples: a sample slower than ``SLOW_SAMPLE_FACTOR`` × the median sample (and at least
``SLOW_SAMPLE_MIN_S``), from each batch's slowest ones as the worker named them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections import Counter
from typing import Any, Iterator, NamedTuple

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.metrics import LoaderSummary, Metrics
from gpufeed.record.reader import IteratorRecord, RunRecord
from gpufeed.record.rows import BatchParts, PartRows


@dataclass
class BatchAnalysis:
    """The training loader's batches, as far as they were measured (None: not measured)."""

    steps_matched: int = 0
    steps_in_window: int = 0
    # The loop's wait, split (shares of the window's wall time)
    wait_share: float | None = None          # the matched steps' wait
    worker_share: float | None = None        # made in the worker (in_order included)
    samples_share: float | None = None       # ... of which reading samples (dataset[i])
    collate_share: float | None = None       # ... of which collate_fn
    in_order_share: float | None = None      # ... of which a later batch was already made
    handover_share: float | None = None      # after its fetch ended, less its pinning
    pinning_share: float | None = None       # while its batch was pinned (None: no pinning row matched)
    # Samples
    batches: int = 0                         # batches with their samples timed
    samples: int = 0
    sample_p50_s: float | None = None        # median of the batches' median sample
    sample_p99_s: float | None = None        # the samples' p99, where the named tail covers it
    slow_bar_s: float | None = None
    slow: list[tuple[int | None, float]] = field(default_factory=list)  # (index, seconds), slowest first
    slow_batch_share: float | None = None    # batches holding a slow sample
    slow_wait_share: float | None = None     # the loop's wait for the matched batches that held one
    slow_excess_s: float | None = None       # the slow samples' time beyond the median sample, summed
    rule: str | None = None                  # the rule the slow indices follow ("index % 101 == 37")
    rule_samples: int = 0                    # the slow samples it covers (named first in ``slow``)
    workers: int | None = None
    prefetch_factor: int | None = None
    pin_memory: bool | None = None

    def sentence(self, data_wait_share: float | None, copy_share: float | None = None) -> str | None:
        """"of the 40% wait, 30 points the worker making the batch (27 reading samples, 3 collating),
        4 in order behind a slower batch, 6 the hand-over, 2 pinning; 2 the copy to the GPU"; None where
        not split. With num_workers=0: "of the 40% wait, 12 points pinning the batch, 28 making it inside
        next()"."""
        if self.wait_share is None:
            return None
        pts = lambda share: f"{share * 100:.0f}"  # noqa: E731
        wait = f"of the {data_wait_share * 100 if data_wait_share is not None else self.wait_share * 100:.0f}% wait, "
        if self.worker_share is None:  # num_workers=0: only pinning is told apart
            if self.pinning_share is None:
                return None
            text = (wait + f"{pts(self.pinning_share)} points pinning the batch (pin_memory), "
                    f"{pts(self.wait_share - self.pinning_share)} making it inside next()")
        else:
            inside = []
            if self.samples_share is not None and self.collate_share is not None:
                inside += [f"{pts(self.samples_share)} reading samples", f"{pts(self.collate_share)} collating"]
            if self.in_order_share:
                inside.append(f"{pts(self.in_order_share)} of them in order, a later batch already made")
            # pinning named apart where measured; else still inside the hand-over
            pin_inside = self.pin_memory and self.pinning_share is None
            text = (wait + f"{pts(self.worker_share)} points the worker making the batch"
                    + (f" ({'; '.join(inside)})" if inside else "")
                    + f", {pts(self.handover_share)} the hand-over (after the batch was made: the worker's queue, "
                    f"pickling, the pipe or shared memory, unpickling{', pinning' if pin_inside else ''}, waking the loop)")
            if self.pinning_share is not None:
                text += f", {pts(self.pinning_share)} pinning (pin_memory)"
        if copy_share is not None:
            text += f"; {pts(copy_share)} the copy to the GPU"
        if self.steps_matched < self.steps_in_window:
            text += f" ({self.steps_matched} of {self.steps_in_window} steps matched to their batch)"
        return text

    @property
    def slow_indices(self) -> list[int]:
        """The slow samples' indices: those the rule covers first, each group in index order."""
        head = sorted({i for i, _ in self.slow[:self.rule_samples] if i is not None})
        return head + sorted({i for i, _ in self.slow[self.rule_samples:] if i is not None} - set(head))

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "slow"}
        d["slow"] = [[i, s] for i, s in self.slow[:th.SLOW_SAMPLES_NAMED]]
        d["slow_indices"] = self.slow_indices[:th.SLOW_SAMPLES_NAMED]
        return d


def in_order_gain(in_order_share: float | None) -> float | None:
    """What ``in_order=False`` predicts at most: the in-order part of the time gone, 1 / (1 - share)
    (bench/in_order.py: 1.09x predicted, 1.07x measured); None where nothing was measured."""
    if in_order_share is None or not 0 < in_order_share < 1:
        return None
    return 1 / (1 - in_order_share)


class Made(NamedTuple):
    """When a worker made a batch: its fetch row's start and end."""

    start: float
    end: float


class Parts(NamedTuple):
    """A batch's samples' and collate's time, and its slowest sample (its ``batch_parts`` row)."""

    samples_s: float
    collate_s: float
    sample_max_s: float


def _fetches_by_worker(record: RunRecord, it: IteratorRecord) -> list[tuple[list[Made], BatchParts | None]] | None:
    """Per worker id (the iterator's worker_pids are in worker id order): when it made each of its
    batches, in time order, and its batch parts (or None)."""
    by_pid = {f.pid: f for f in record.fetches}
    out = []
    for pid in it.worker_pids:
        f = by_pid.get(pid)
        if f is None or not len(f.rows):
            return None
        order = np.argsort(f.rows.t_start, kind="stable")
        made = [Made(float(a), float(b)) for a, b in zip(f.rows.t_start[order], f.rows.t_end[order])]
        out.append((made, record.batch_parts.get(pid)))
    return out


def _parts_of(parts: BatchParts | None, t_start: float) -> Parts | None:
    """The parts of the batch whose fetch started at ``t_start``."""
    if parts is None or not len(parts.rows):
        return None
    starts = parts.rows.t_start
    k = int(np.searchsorted(starts, t_start))
    if k < len(starts) and starts[k] == t_start:
        return Parts(float(parts.rows.samples_s[k]), float(parts.rows.collate_s[k]), float(parts.rows.sample_max_s[k]))
    return None


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class Step(NamedTuple):
    """One step of an iterator's first epoch matched to its batch (``matched_steps``)."""

    index: int
    t_request: float
    t_deliver: float
    start: float | None     # its batch's fetch (None: the batch is not in the record)
    end: float | None
    ready: float            # the earliest fetch end of a later batch in flight (inf: none)
    parts: BatchParts | None  # its worker's batch parts
    pin: Made | None = None   # its batch's pinning (None: not pinned, or not matched)


def analyze(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> BatchAnalysis | None:
    if training is None or not m.wall_s or m.window_start_t is None or m.window_end_t is None:
        return None
    owned = [it for it in record.iterators if training.owns(it) and len(it.steps) and it.config.offload is None]
    its = [it for it in owned if len(it.worker_pids) >= 1]
    if not its:
        # num_workers=0: the batch is made and pinned inside next(); only pinning is told apart
        pinned = [it for it in owned if not it.worker_pids and len(it.pins)]
        return _split_in_process(pinned, m) if pinned else None
    out = BatchAnalysis(workers=its[0].config.num_workers, prefetch_factor=its[0].config.prefetch_factor or 2,
                        pin_memory=its[0].config.pin_memory)
    _samples(record, its, m, out)
    _split(record, its, m, out)
    return out


def _pins_matched(it: IteratorRecord, workers: list[tuple[list[Made], BatchParts | None]], t_deliver: dict[int, float],
                  first_epoch_end: float) -> dict[int, Made]:
    """Each first-epoch batch's pinning (index -> its ``pins`` row's start and end): the batches in the
    order their fetches ended against the pin thread's rows in order. Empty where the match fails: more
    than ``MATCH_MAX_LATE_SHARE`` of the batches taken pinned before they were made or delivered before
    they were pinned."""
    pins = it.pins
    if not len(pins):
        return {}
    pins = pins[pins.t_start < first_epoch_end]
    n = len(workers)
    made = sorted(((r.end, k * n + w) for w, (rows, _p) in enumerate(workers) for k, r in enumerate(rows)
                   if r.end < first_epoch_end))
    out = {i: Made(float(a), float(b)) for (_end, i), a, b in zip(made, pins.t_start, pins.t_end)}
    ends = dict((i, end) for end, i in made)
    taken = [i for i in out if i in t_deliver]
    wrong = [i for i in taken if out[i].start < ends[i] - th.MATCH_SLACK_S or out[i].end > t_deliver[i] + th.MATCH_SLACK_S]
    if not taken or len(wrong) > th.MATCH_MAX_LATE_SHARE * len(taken):
        return {}
    return out


def matched_steps(record: RunRecord, it: IteratorRecord) -> Iterator[Step]:
    """Each step of the iterator's first epoch matched to its worker's batch, where the match holds
    (``Step``), with its pinning where the pins match too. A step whose batch is not in the record gives
    ``start`` None. Nothing where the match fails (``MATCH_MAX_LATE_SHARE``)."""
    if len(it.worker_pids) < 1 or not len(it.steps) or it.config.offload is not None:
        return
    workers = _fetches_by_worker(record, it)
    if workers is None:
        return
    n = len(workers)
    ahead = n * (it.config.prefetch_factor or 2)
    steps = it.steps
    first_epoch_end = it.epoch_starts[0] if it.epoch_starts else math.inf
    first_epoch = np.asarray(steps.t_request) < first_epoch_end
    idx = np.asarray(steps.index).astype(int)

    def row(i: int) -> Made | None:  # each step's batch: when its worker made it, or None
        w, k = i % n, i // n
        rows = workers[w][0]
        return rows[k] if k < len(rows) else None
    made = {int(i): row(int(i)) for i in idx[first_epoch]}
    ok = [i for i, r in made.items() if r is not None]
    # The match holds when batches are delivered after their worker finished them.
    late = [i for i in ok if made[i].end > steps.t_deliver[np.searchsorted(idx, i)] + th.MATCH_SLACK_S]
    if not ok or len(late) > th.MATCH_MAX_LATE_SHARE * len(ok):
        return
    delivered = {int(i): float(t) for i, t in zip(idx[first_epoch], np.asarray(steps.t_deliver)[first_epoch])}
    pins = _pins_matched(it, workers, delivered, first_epoch_end)
    for pos in np.flatnonzero(first_epoch):
        i = int(idx[pos])
        t_req, t_del = float(steps.t_request[pos]), float(steps.t_deliver[pos])
        r = made.get(i)
        if r is None:
            yield Step(i, t_req, t_del, None, None, math.inf, None)
            continue
        later = [made[j].end for j in range(i + 1, i + ahead) if made.get(j) is not None]
        yield Step(i, t_req, t_del, r.start, r.end, float(min(later, default=math.inf)), workers[i % n][1], pins.get(i))


def _split_in_process(its: list[IteratorRecord], m: Metrics) -> BatchAnalysis | None:
    """num_workers=0 with pinning: each step's wait, and of it the pinning row inside it (made on the
    training thread inside next(), so a row inside the step's wait is its batch's)."""
    out = BatchAnalysis(workers=0, pin_memory=True)
    wait = pinning = 0.0
    matched = in_window = 0
    for it in its:
        starts, ends = np.asarray(it.pins.t_start), np.asarray(it.pins.t_end)
        for t_req, t_del in zip(np.asarray(it.steps.t_request), np.asarray(it.steps.t_deliver)):
            if not (m.window_start_t <= t_req and t_del <= m.window_end_t):
                continue
            in_window += 1
            k = int(np.searchsorted(starts, t_req))
            if k < len(starts) and ends[k] <= t_del:
                matched += 1
                wait += t_del - t_req
                pinning += ends[k] - starts[k]
    out.steps_matched, out.steps_in_window = matched, in_window
    if matched:
        out.wait_share, out.pinning_share = wait / m.wall_s, pinning / m.wall_s
    return out


def _split(record: RunRecord, its: list[IteratorRecord], m: Metrics, out: BatchAnalysis) -> None:
    waits = dict(worker=0.0, samples=0.0, collate=0.0, in_order=0.0, handover=0.0, pinning=0.0, wait=0.0)
    slow_wait, matched, in_window, pinned = 0.0, 0, 0, 0
    bar = out.slow_bar_s
    for it in its:
        for _i, t_req, t_del, start, end, ready, part_rows, pin in matched_steps(record, it):
            if not (m.window_start_t <= t_req and t_del <= m.window_end_t):
                continue
            in_window += 1
            if start is None:
                continue
            matched += 1
            wait = t_del - t_req
            waits["wait"] += wait
            in_worker = _overlap(t_req, t_del, -math.inf, end)
            waits["worker"] += in_worker
            # its pinning lies after its fetch ended: out of the hand-over
            pin_s = _overlap(t_req, t_del, pin.start, pin.end) if pin is not None else 0.0
            pinned += pin is not None
            waits["pinning"] += pin_s
            waits["handover"] += wait - in_worker - pin_s
            parts = _parts_of(part_rows, start)
            made_s = end - start
            if parts is not None and made_s > 0:
                # the part of the wait while this batch itself was made, split by its parts
                own = _overlap(t_req, t_del, start, end)
                waits["samples"] += own * min(parts.samples_s / made_s, 1.0)
                waits["collate"] += own * min(parts.collate_s / made_s, 1.0 - min(parts.samples_s / made_s, 1.0))
            if ready < end:
                waits["in_order"] += _overlap(t_req, t_del, ready, end)
            if bar is not None and parts is not None and parts.sample_max_s >= bar:
                slow_wait += wait
    out.steps_matched, out.steps_in_window = matched, in_window
    if not matched:
        return
    wall = m.wall_s
    out.wait_share = waits["wait"] / wall
    out.worker_share = waits["worker"] / wall
    out.samples_share = waits["samples"] / wall if any(record.batch_parts.get(p) for it in its for p in it.worker_pids) else None
    out.collate_share = waits["collate"] / wall if out.samples_share is not None else None
    out.in_order_share = waits["in_order"] / wall
    out.handover_share = waits["handover"] / wall
    out.pinning_share = waits["pinning"] / wall if pinned else None
    out.slow_wait_share = slow_wait / wall if bar is not None else None


def _samples(record: RunRecord, its: list[IteratorRecord], m: Metrics, out: BatchAnalysis) -> None:
    """The samples' tail, from the training loader's workers' batch parts inside the window."""
    pids = {p for it in its for p in it.worker_pids}
    rows, slow = [], []
    for pid in pids:
        parts = record.batch_parts.get(pid)
        if parts is None or not len(parts.rows):
            continue
        r = parts.rows
        rows.append(r[(r.t_start >= m.window_start_t) & (r.t_start <= m.window_end_t)])
        slow += [(t, i, s) for t, i, s in parts.slow if m.window_start_t <= t <= m.window_end_t]
    if not rows:
        return
    table = PartRows.concat(rows)
    table = PartRows.of(table[np.isfinite(table.sample_p50_s)])
    if not len(table):
        return
    out.batches, out.samples = len(table), int(np.nansum(table.samples))
    out.sample_p50_s = float(np.median(table.sample_p50_s))
    bar = max(th.SLOW_SAMPLE_FACTOR * out.sample_p50_s, th.SLOW_SAMPLE_MIN_S)
    out.slow_bar_s = bar
    named = _slowest_group(sorted(((i, s) for _t, i, s in slow if s >= bar), key=lambda x: -x[1]))
    bar = out.slow_bar_s = min((s for _i, s in named), default=bar)
    out.slow = named
    out.slow_batch_share = float(np.mean(table.sample_max_s >= bar))
    out.slow_excess_s = float(sum(s - out.sample_p50_s for _i, s in named))
    # p99 of the samples: the k-th slowest, when the named tail (every sample above the bar) reaches it
    k = max(1, math.ceil(0.01 * out.samples))
    tail = sorted((s for _t, _i, s in slow), reverse=True)
    out.sample_p99_s = tail[k - 1] if len(tail) >= k and tail[k - 1] >= bar else None
    out.rule, following = index_rule(named, out.sample_p50_s)
    if following:  # the samples the rule names first (a busy machine's stray slow reads after them)
        out.slow = [x for x in named if x[0] in following] + [x for x in named if x[0] not in following]
        out.rule_samples = len(following)


def _slowest_group(named: list[tuple[int | None, float]]) -> list[tuple[int | None, float]]:
    """The slow samples above the largest gap in their times (slowest first), where one sample is at least
    ``SLOW_GROUP_GAP`` times the next: rare slow samples of one kind stand apart from a busy machine's
    scatter (a 1 ms read taking 5-20 ms under load against 80 ms ones); else all of them."""
    if len(named) < 2:
        return named
    ratios = [a[1] / b[1] if b[1] > 0 else math.inf for a, b in zip(named, named[1:])]
    cut = int(np.argmax(ratios))
    return named[:cut + 1] if ratios[cut] >= th.SLOW_GROUP_GAP else named


def index_rule(named: list[tuple[int | None, float]], p50_s: float) -> tuple[str | None, set[int]]:
    """``index % m == r`` and the indices it covers, where it covers at least 3 slow samples and at least
    ``SLOW_RULE_MIN_EXCESS_SHARE`` of their time beyond the median sample: m from the most common
    differences between slow indices (> 1), r the most common residue; else (None, {})."""
    indices = sorted({i for i, _s in named if i is not None})[:th.SLOW_RULE_MAX_INDICES]
    if len(indices) < 3:
        return None, set()
    excess = {i: s - p50_s for i, s in named if i is not None}
    total = sum(max(v, 0.0) for v in excess.values())
    diffs = Counter(b - a for k, a in enumerate(indices) for b in indices[k + 1:])
    best: tuple[float, str, set[int]] | None = None
    for m, _count in diffs.most_common(8):
        if m <= 1:
            continue
        r, _n = Counter(i % m for i in indices).most_common(1)[0]
        covered = {i for i in indices if i % m == r}
        share = sum(max(excess[i], 0.0) for i in covered) / total if total > 0 else 0.0
        if len(covered) >= 3 and share >= th.SLOW_RULE_MIN_EXCESS_SHARE and (best is None or share > best[0] + 1e-9):
            best = (share, f"index % {m} == {r}", covered)
    return (best[1], best[2]) if best else (None, set())
