"""The search's last step: its winner confirmed against your configuration in alternated pairs of
runs, yours then the winner's (``TUNE_CONFIRM_PAIRS``). The speed-up is the median of the pairs'
ratios, with their range, never one run of the winner against another of yours (the winner of a
search is the luckiest of its runs); where the pairs do not clear the tie band, your configuration
stays (a tie with yours is no reason to change)."""
from __future__ import annotations

import statistics
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.tune.result import Trial


def run_pairs(run_once: Callable[[Trial], None], baseline: Trial, best: Trial, pairs: int,
              confirmation: dict) -> None:
    """``pairs`` alternated runs, each pair's ratio into ``confirmation`` ({"pairs", "ratios", "of"}) as it
    ends: a search stopped midway (``run_once`` raising) keeps the pairs that ran."""
    for _ in range(pairs):
        before = (len(baseline.ok_rates), len(best.ok_rates))
        run_once(baseline)
        run_once(best)
        if (len(baseline.ok_rates), len(best.ok_rates)) == (before[0] + 1, before[1] + 1):
            confirmation["ratios"].append(best.ok_rates[-1] / baseline.ok_rates[-1])
            confirmation["pairs"] += 1


def confirmed_or_kept(confirmation: dict | None, baseline: Trial, best: Trial, noise: float) -> Trial:
    """The winner, or your configuration where its pairs measured a tie with yours; ``confirmation``
    gets the median ratio and its range (and ``kept_yours``)."""
    c = confirmation
    if not c or not c["ratios"]:
        return best
    ratios = sorted(c["ratios"])
    c.update(speedup=statistics.median(ratios), low=ratios[0], high=ratios[-1])
    if c["speedup"] < 1.0 + th.TUNE_TIE_SHARE_OF_NOISE * noise:
        c["kept_yours"] = True  # a tie with yours keeps yours: no change is worth making for it
        return baseline
    return best
