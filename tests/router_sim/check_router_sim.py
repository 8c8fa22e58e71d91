#!/usr/bin/env python3
"""Smoke test of bench/router_sim: on a slice of a trace, the similarity-affinity router must give a higher
block hit ratio than random and round-robin routing and keep the busiest worker below 1.5x the mean load.
Also checks that one worker reproduces the reference LRU rule of ../shared/data/README.md, computed here
independently. Exit 77 (skipped) when the trace is absent."""
import argparse
import collections
import json
import os
import subprocess
import sys


def reference_lru(path, limit, capacity):
    cache = collections.OrderedDict()
    hits = blocks = 0
    with open(path) as f:
        for n, line in enumerate(f):
            if n >= limit:
                break
            ids = json.loads(line)["hash_ids"]
            run = 0
            while run < len(ids) and ids[run] in cache:
                run += 1
            hits += run
            blocks += len(ids)
            for i in ids:
                if i in cache:
                    cache.move_to_end(i)
                else:
                    if len(cache) >= capacity:
                        cache.popitem(last=False)
                    cache[i] = True
    return hits, blocks


def run(binary, trace, limit, extra):
    out = subprocess.run([binary, "--trace", trace, "--limit", str(limit), "--json"] + extra,
                         check=True, capture_output=True, text=True).stdout
    return {r["router"]: r for r in map(json.loads, out.splitlines())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router-sim", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--limit", type=int, default=3000)
    a = ap.parse_args()
    if not os.path.exists(a.trace):
        print(f"skipped: {a.trace} is absent")
        return 77
    failures = []

    res = run(a.router_sim, a.trace, a.limit, [])
    for name, r in sorted(res.items()):
        print(f"{name:20s} hit_ratio {r['hit_ratio']:.4f} max/mean load {r['max_mean_load']:.3f}")
    aff = res["affinity"]
    for baseline in ("random", "round_robin"):
        if not aff["hit_ratio"] > res[baseline]["hit_ratio"]:
            failures.append(f"affinity {aff['hit_ratio']:.4f} does not beat {baseline} {res[baseline]['hit_ratio']:.4f}")
    for name in ("affinity", "affinity_stateless", "prefix4_bounded"):
        if not res[name]["max_mean_load"] < 1.5:
            failures.append(f"{name}: max/mean load {res[name]['max_mean_load']:.3f} >= 1.5")
    if aff["blocks"] != res["random"]["blocks"]:
        failures.append("routers replayed different block counts")

    # One worker: every router is the reference LRU.
    one = run(a.router_sim, a.trace, a.limit, ["--workers", "1", "--capacity_blocks", "800", "--routers", "round_robin"])
    hits, blocks = reference_lru(a.trace, a.limit, 800)
    r = one["round_robin"]
    if (r["hit_blocks"], r["blocks"]) != (hits, blocks):
        failures.append(f"1 worker: {r['hit_blocks']}/{r['blocks']} hit blocks, the reference LRU gives {hits}/{blocks}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
