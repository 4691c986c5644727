"""What the run comparisons (compare_runs.py, state_compare.py) read from a
run directory: the training loss of every step in metrics.jsonl (the last
record of a step counts; evaluation records, which carry a dice, do not)."""
import json


def losses(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        m = json.loads(line)
        if "loss" in m and "dice" not in m:
            out[m["step"]] = m["loss"]
    return out
