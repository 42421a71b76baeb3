#!/usr/bin/env python3
"""An idealised model of the 500-job mixed workload (mixed-500.jsonl) on
4 x 8 GPUs, for one question of issue #20: could any placement rule bring
the high-priority class's p99 wait to half of Slurm's without costing the
makespan or the medium class?

It is not the broker: starts are instantaneous, there is no cycle interval
and no agent. It keeps what decides the high class's waits: strict
priority order (high, medium, low; first come first served within),
EASY backfill of the first blocked job on declared timeouts (the duration
plus 5 s, rounded, as benche2e declares them), optionally high jobs
preempting low ones (requeued from scratch), and a placement rule:

  bestfit  the broker's: the fitting node with the fewest free cards
  horizon  for jobs that cannot be preempted, the node whose declared end
           of such work grows least (empty nodes last), then best fit
  keepnode best fit, but a medium job may not take the last node that
           holds no work that cannot be preempted (preemptible low only)
  keepnode/D  the same, except for medium jobs declared at most D s long
  headH    best fit, but a medium job may not leave fewer than H cards
           free or held by preemptible work (preemptible low only)
  bysize   best fit, ordering each class by size (largest first), then
           submit time
  RULE+barrier  RULE, and while a high job waits for cards no job that
           cannot be preempted starts anywhere (2026-12-04)

Each rule runs on the workload as written (seed -1) and on 12 copies with
durations stretched by up to 50 ms and submits delayed by up to 20 ms,
the jitter of a real replay. docs/benchmarks.md has its output:

  python3 deploy/bench/placement_model.py
"""
import json
import math
import os
import random

N, K = 4, 8
CLASS = {"high": 0, "medium": 1, "low": 2}
GOAL_HIGH, SLURM_MEDIUM, GOAL_MAKESPAN = 1.6, 9.6, 1.01


def declared(j):
    return max(1, round(j["duration_s"] + 5))


def p99(xs):
    xs = sorted(xs)
    return xs[math.ceil(0.99 * len(xs)) - 1]


def replay(jobs, rule, preempt):
    barrier = rule.endswith("+barrier")
    rule = rule.removesuffix("+barrier")
    bysize = rule == "bysize"
    free = [K] * N
    running = []  # [end, node, gpus, job, start]
    pending, first = [], {}
    todo = sorted(jobs, key=lambda j: j["submit_s"])
    k, last_end = 0, 0.0

    def hard_job(j):
        return not (preempt and j["priority"] == "low")

    def hard(r):
        return hard_job(r[3])

    def horizon(n, t):
        ends = [r[4] + declared(r[3]) for r in running if r[1] == n and hard(r)]
        return max(ends) if ends else None

    def place(j, t, ok):
        fit = [n for n in range(N) if free[n] >= j["gpus"] and ok(n)]
        if rule.startswith("keepnode") and preempt and j["priority"] == "medium":
            lim = float(rule.split("/")[1]) if "/" in rule else 0
            cl = [n for n in range(N) if horizon(n, t) is None]  # no hard work
            if len(cl) <= 1 and declared(j) > lim:
                fit = [n for n in fit if n not in cl]
        if rule.startswith("head") and preempt and j["priority"] == "medium":
            soft = sum(free) + sum(r[2] for r in running if not hard(r))
            if soft - j["gpus"] < int(rule[4:]):
                fit = []
        if not fit:
            return None
        if rule == "horizon" and not (preempt and j["priority"] == "low"):
            end = t + declared(j)

            def grow(n):
                h = horizon(n, t)
                return math.inf if h is None else max(0, end - h)

            return min(fit, key=lambda n: (grow(n), free[n], n))
        return min(fit, key=lambda n: (free[n], n))

    def preempt_for(j):
        best = None
        for n in range(N):
            lows = sorted((r for r in running if r[1] == n and not hard(r)), key=lambda r: -r[4])
            f, victims = free[n], []
            for r in lows:
                if f >= j["gpus"]:
                    break
                victims.append(r)
                f += r[2]
            if f >= j["gpus"] and (best is None or sum(v[2] for v in victims) < best[0]):
                best = (sum(v[2] for v in victims), n, victims)
        if best is None:
            return None
        for v in best[2]:
            running.remove(v)
            free[v[1]] += v[2]
            pending.append(v[3])
        return best[1]

    def reserve(j, t):
        best = None
        for n in range(N):
            f, at = free[n], t
            for e, g in sorted((r[4] + declared(r[3]), r[2]) for r in running if r[1] == n):
                if f >= j["gpus"]:
                    break
                f, at = f + g, e
            if f >= j["gpus"] and (best is None or at < best[1]):
                best = (n, at)
        return best

    while k < len(todo) or pending or running:
        t = min(([todo[k]["submit_s"]] if k < len(todo) else []) + [r[0] for r in running])
        for r in [r for r in running if r[0] <= t + 1e-9]:
            running.remove(r)
            free[r[1]] += r[2]
            last_end = max(last_end, r[0])
        while k < len(todo) and todo[k]["submit_s"] <= t + 1e-9:
            pending.append(todo[k])
            k += 1
        pending.sort(key=lambda j: (CLASS[j["priority"]], -j["gpus"] if bysize else 0, j["submit_s"]))
        resv, high_waits = None, False
        for j in list(pending):
            if j not in pending:
                continue

            def ok(n, j=j):
                if barrier and high_waits and j["priority"] != "high" and hard_job(j):
                    return False
                return not (resv and n == resv[0] and t + declared(j) > resv[1])

            n = place(j, t, ok)
            if n is None and preempt and j["priority"] == "high":
                n = preempt_for(j)
            if n is not None:
                free[n] -= j["gpus"]
                running.append([t + j["duration_s"], n, j["gpus"], j, t])
                first.setdefault(j["id"], t)
                pending.remove(j)
            elif resv is None:
                resv = reserve(j, t)
                high_waits = j["priority"] == "high"
    waits = {c: [first[j["id"]] - j["submit_s"] for j in jobs if j["priority"] == c] for c in CLASS}
    bound = max(j["submit_s"] + j["duration_s"] for j in jobs)
    return {c: p99(w) for c, w in waits.items()}, last_end / bound


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixed-500.jsonl")
    with open(path) as f:
        base = [json.loads(line) for line in f]
    print("rule            preemptible low  high p99 as written, over 12 jittered copies (s)   "
          "medium p99 max  makespan max  copies meeting all three")
    runs = [(p, r) for p in (False, True) for r in ("bestfit", "horizon")]
    # Rules that hold back medium work for the high class (issue #20,
    # 2026-12-03): they act only when low jobs are preemptible.
    runs += [(True, r) for r in ("keepnode", "keepnode/10", "head4", "head8", "head12")]
    runs += [(p, "bysize") for p in (False, True)]
    runs += [(p, r + "+barrier") for p in (False, True) for r in ("bestfit", "horizon")]
    for preempt, rule in runs:
        rows = []
        for seed in range(-1, 12):
            jobs = [dict(j) for j in base]
            if seed >= 0:
                rnd = random.Random(seed)
                for j in jobs:
                    j["duration_s"] += rnd.uniform(0, 0.05)
                    j["submit_s"] += rnd.uniform(0, 0.02)
            rows.append(replay(jobs, rule, preempt))
        highs = sorted(r[0]["high"] for r in rows[1:])
        met = sum(1 for w, m in rows[1:] if w["high"] <= GOAL_HIGH and w["medium"] <= SLURM_MEDIUM and m <= GOAL_MAKESPAN)
        print(f"{rule:15} {str(preempt):16} {rows[0][0]['high']:.2f}; {highs[0]:.2f}-{highs[-1]:.2f} "
              f"(median {highs[6]:.2f}){'':24} {max(r[0]['medium'] for r in rows):5.2f}  "
              f"{max(r[1] for r in rows):12.3f}  {met:2d} of 12")


if __name__ == "__main__":
    main()
