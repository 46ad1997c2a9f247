"""The script's own count of what it trained on, kept apart from gpufeed's: one JSON line per
training step ({"t": perf_counter at the step, "n": samples in its batch}) and one per evaluation
pass ({"eval": [start, end]}), in the file named by OWN_COUNT (nothing when it is unset).

time.perf_counter() is CLOCK_MONOTONIC on Linux, the clock of gpufeed's run record, so a test can
count the script's own samples over gpufeed's measured window."""
import json
import os
import time


class OwnCount:
    def __init__(self) -> None:
        path = os.environ.get("OWN_COUNT")
        rank = os.environ.get("RANK")
        if path and rank is not None:
            path = f"{path}.{rank}"
        self.file = open(path, "a", buffering=1) if path else None
        self.eval_start = None

    def step(self, samples: int) -> None:
        if self.file:
            self.file.write(json.dumps({"t": time.perf_counter(), "n": int(samples)}) + "\n")

    def eval_begins(self) -> None:
        self.eval_start = time.perf_counter()

    def eval_ends(self) -> None:
        if self.file and self.eval_start is not None:
            self.file.write(json.dumps({"eval": [self.eval_start, time.perf_counter()]}) + "\n")
        self.eval_start = None
