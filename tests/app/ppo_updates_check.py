"""PPO mini-batches in the RL job (RlOptions::ppo_mini_batches): reads two --metrics files of the
same synchronous job (--max-staleness 0), one at a single update a step, one at several, and
checks that the settings row names them, that each step made mini-batches x epochs optimizer
updates at the step's learning rate (the schedule advancing once a step, as at one update), and
that the PPO clip acted only where an update of the step had moved the policy before the next
trained (at one update a step the ratio is 1: no clip).

usage: ppo_updates_check.py ONE_UPDATE.jsonl MANY_UPDATES.jsonl MINI_BATCHES EPOCHS STEPS
"""
import json
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def steps(rs):
    return [r["data"] for r in rs if "actor/pg_clipfrac" in r.get("data", {})]


def settings(rs):
    for r in rs:
        if "config" in r:
            return r["config"]
    sys.exit("no settings row (config)")


one, many = rows(sys.argv[1]), rows(sys.argv[2])
mini, epochs, n = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s1, sm = settings(one), settings(many)
assert (s1["ppo_mini_batches"], s1["ppo_epochs"]) == (1, 1), s1
assert (sm["ppo_mini_batches"], sm["ppo_epochs"]) == (mini, epochs), sm
a, b = steps(one), steps(many)
assert len(a) == n and len(b) == n, (len(a), len(b))
assert [r["crl/optimizer_updates"] for r in a] == [1] * n, a
assert [r["crl/optimizer_updates"] for r in b] == [mini * epochs] * n, b
lr_one, lr_many = [r["actor/lr"] for r in a], [r["actor/lr"] for r in b]
assert lr_one == lr_many and len(set(lr_one)) == n, f"learning rates {lr_one} vs {lr_many}"
clip_one = [r["actor/pg_clipfrac"] for r in a]
clip_many = [r["actor/pg_clipfrac"] for r in b]
assert all(c == 0 for c in clip_one), f"one update a step clipped: {clip_one}"
assert any(c > 0 for c in clip_many), f"{mini} x {epochs} updates a step never clipped: {clip_many}"
print(f"ppo updates: clip fraction {clip_one} at 1 update a step, {clip_many} at {mini} x {epochs}")
