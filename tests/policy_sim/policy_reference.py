#!/usr/bin/env python3
"""An independent reference for bench/policy_sim: LRU and Belady's per-block optimum, written from the
rules of ../shared/data/README.md with the Python standard library only (it shares no code with the
C++ simulator).

  hit      = a request's count of leading blocks present before it is served;
             block hit ratio = sum of hits / sum of blocks (every hash id is one block)
  update   = after each request its blocks are touched (or inserted) in order, first to last
  LRU      = the victim is the least recently touched block
  tiered   = (--disk-capacity M) the server's tier structure with LRU in each tier: a host tier of
             the capacity and a disk tier of M blocks, exclusive; a host victim is demoted to disk
             (whose least recent block is dropped to make room, never the block being promoted); a
             block of the leading run that is on disk moves back to host; a block after it that is
             on disk is only touched there
  Belady   = the victim is the cached block whose next use is farthest in the future; an incoming
             block whose next use is farther than every cached block's, or that is never used
             again, is not admitted. "Next use" is the position of the block's next access in the
             sequence of all accesses (requests concatenated, blocks first to last).

Usage:
  policy_reference.py --trace conversation_trace.jsonl --limit 2000 --capacities 200,800
  policy_reference.py --check build/bench/policy_sim/policy_sim --trace ... --limit 2000
In --check mode it runs policy_sim --json on the same slice and exits 0 when every hit count is
equal, 1 when one differs, and 77 (ctest's skip code here) when the trace file is absent. It then
runs every policy once (--policy all) with --csv, --svg and --png, and checks that the files are complete.
"""
import argparse
import collections
import heapq
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

SKIP = 77


def load_mooncake(path, limit):
    requests = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            requests.append(json.loads(line)["hash_ids"])
            if limit and len(requests) >= limit:
                break
    return requests


def load_kv_cache_tester(directory, sessions):
    """Key (session index, id); sub-agents flattened at their t plus their requests' t; session k at
    k * 60 s; merged by time, ties to the lower session, then file order."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    if sessions:
        files = files[:sessions]
    timed = []
    for k, name in enumerate(files):
        with open(os.path.join(directory, name)) as f:
            session = json.load(f)
        order = 0
        stack = [(session["requests"], 60.0 * k)]

        def walk(reqs, base):
            nonlocal order
            for r in reqs:
                if r.get("type") == "subagent":
                    walk(r["requests"], base + r["t"])
                    continue
                timed.append((base + r["t"], k, order, [(k, i) for i in r["hash_ids"]]))
                order += 1

        walk(*stack[0])
    timed.sort(key=lambda x: (x[0], x[1], x[2]))
    return [ids for _, _, _, ids in timed]


def lru(requests, capacity):
    cache = collections.OrderedDict()  # least recently touched first
    hits = blocks = 0
    for ids in requests:
        n = 0
        while n < len(ids) and ids[n] in cache:
            n += 1
        hits += n
        blocks += len(ids)
        for b in ids:
            if b in cache:
                cache.move_to_end(b)
            else:
                if capacity and len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[b] = True
    return hits, blocks


def lru_tiered(requests, capacity, disk_capacity):
    host = collections.OrderedDict()  # least recently touched first
    disk = collections.OrderedDict()
    hits = blocks = 0

    def make_host_room(keep):
        while len(host) >= capacity:
            victim, _ = host.popitem(last=False)
            while len(disk) >= disk_capacity:
                drop = next((b for b in disk if b != keep), None)
                if drop is None:
                    break
                del disk[drop]
            if len(disk) < disk_capacity:
                disk[victim] = True

    for ids in requests:
        n = 0
        while n < len(ids) and (ids[n] in host or ids[n] in disk):
            n += 1
        hits += n
        blocks += len(ids)
        for i, b in enumerate(ids):
            if b in host:
                host.move_to_end(b)
            elif b in disk:
                if i < n:
                    make_host_room(b)
                    del disk[b]
                    host[b] = True
                else:
                    disk.move_to_end(b)
            else:
                make_host_room(None)
                host[b] = True
    return hits, blocks


def belady(requests, capacity):
    stream = [b for ids in requests for b in ids]
    never = len(stream)
    next_use = [never] * len(stream)
    last = {}
    for p in range(len(stream) - 1, -1, -1):
        next_use[p] = last.get(stream[p], never)
        last[stream[p]] = p
    cached = {}  # block -> its next use
    heap = []    # (-next use, block), stale entries skipped on pop
    hits = blocks = 0
    p = 0
    for ids in requests:
        n = 0
        while n < len(ids) and ids[n] in cached:
            n += 1
        hits += n
        blocks += len(ids)
        for b in ids:
            nxt = next_use[p]
            p += 1
            if b in cached:
                cached[b] = nxt
                heapq.heappush(heap, (-nxt, b))
                continue
            if nxt == never:
                continue  # never used again: not admitted
            if capacity and len(cached) >= capacity:
                while heap[0][1] not in cached or cached[heap[0][1]] != -heap[0][0]:
                    heapq.heappop(heap)
                if -heap[0][0] < nxt:
                    continue  # farther than every cached block's next use: not admitted
                del cached[heapq.heappop(heap)[1]]
            cached[b] = nxt
            heapq.heappush(heap, (-nxt, b))
    return hits, blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True, help="Mooncake JSONL, or a kv-cache-tester directory")
    ap.add_argument("--limit", type=int, default=0, help="first N requests (0 = all)")
    ap.add_argument("--sessions", type=int, default=0, help="kv-cache-tester: first N sessions (0 = all)")
    ap.add_argument("--capacities", default="200,800,3200,0", help="blocks; 0 = infinite")
    ap.add_argument("--disk-capacity", type=int, default=0,
                    help="also check LRU with a disk tier of this many blocks below each finite capacity")
    ap.add_argument("--check", metavar="POLICY_SIM", help="compare with this policy_sim binary")
    args = ap.parse_args()
    if not os.path.exists(args.trace):
        print(f"SKIP: {args.trace} is absent", file=sys.stderr)
        return SKIP
    if os.path.isdir(args.trace):
        requests = load_kv_cache_tester(args.trace, args.sessions)
    else:
        requests = load_mooncake(args.trace, 0)
    if args.limit:
        requests = requests[: args.limit]
    capacities = [int(c) for c in args.capacities.split(",")]
    expected = {}
    for c in capacities:
        for name, fn in (("lru", lru), ("belady", belady)):
            expected[(name, c)] = fn(requests, c)
            h, b = expected[(name, c)]
            print(f"reference {name:7s} capacity {c or 'inf':>8}: {h} / {b} = {h / b:.6f}")
    tiered = {}
    if args.disk_capacity:
        for c in capacities:
            if c:
                tiered[c] = lru_tiered(requests, c, args.disk_capacity)
                h, b = tiered[c]
                print(f"reference lru host {c} + disk {args.disk_capacity}: {h} / {b} = {h / b:.6f}")
    if not args.check:
        return 0
    if tiered:
        failures = check_tiered(args, capacities, tiered)
        if failures:
            return 1
    cmd = [args.check, "--trace", args.trace, "--policy", "lru,belady", "--json",
           "--capacities", ",".join(str(c) if c else "inf" for c in capacities)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.sessions:
        cmd += ["--sessions", str(args.sessions)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    failures = 0
    seen = 0
    for line in out.splitlines():
        r = json.loads(line)
        key = (r["policy"], r["capacity_blocks"] or 0)
        if key not in expected:
            continue
        seen += 1
        want = expected[key]
        got = (r["hit_blocks"], r["blocks"])
        status = "ok" if got == want else "MISMATCH"
        failures += got != want
        print(f"policy_sim {key[0]:7s} capacity {key[1] or 'inf':>8}: {got[0]} / {got[1]}  {status}")
    if seen != len(expected):
        print(f"policy_sim reported {seen} of {len(expected)} results", file=sys.stderr)
        return 1
    if failures:
        return 1
    return smoke_all_policies(cmd, capacities)


def check_tiered(args, capacities, tiered):
    cmd = [args.check, "--trace", args.trace, "--policy", "lru", "--json", "--disk_capacity", str(args.disk_capacity),
           "--capacities", ",".join(str(c) for c in capacities if c)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.sessions:
        cmd += ["--sessions", str(args.sessions)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    failures = 0
    seen = 0
    for line in out.splitlines():
        r = json.loads(line)
        if r["policy"] != "lru" or r["disk_capacity_blocks"] != args.disk_capacity:
            continue
        seen += 1
        want = tiered[r["capacity_blocks"]]
        got = (r["hit_blocks"], r["blocks"])
        status = "ok" if got == want else "MISMATCH"
        failures += got != want
        print(f"policy_sim lru host {r['capacity_blocks']} + disk {args.disk_capacity}: {got[0]} / {got[1]}  {status}"
              f"  (disk hits {r['disk_hit_blocks']}, demotions {r['demotions']}, promotions {r['promotions']})")
    if seen != len(tiered):
        print(f"policy_sim reported {seen} of {len(tiered)} tiered results", file=sys.stderr)
        return 1
    return failures


def smoke_all_policies(cmd, capacities):
    """Every policy runs on the slice and the sweep's CSV and SVG are written in full."""
    with tempfile.TemporaryDirectory() as tmp:
        csv_path, svg_path = os.path.join(tmp, "sweep.csv"), os.path.join(tmp, "sweep.svg")
        all_cmd = [c if c != "lru,belady" else "all" for c in cmd if c != "--json"]
        png_path = os.path.join(tmp, "sweep.png")
        subprocess.run(all_cmd + ["--csv", csv_path, "--svg", svg_path, "--png", png_path], check=True,
                       capture_output=True)
        with open(png_path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                print("--png did not write a PNG file", file=sys.stderr)
                return 1
        with open(csv_path) as f:
            rows = [line.rstrip("\n").split(",") for line in f][1:]
        policies = sorted({r[0] for r in rows})
        want = len(policies) * len(capacities)
        bad = [r for r in rows if not 0.0 <= float(r[2]) <= 1.0]
        ElementTree.parse(svg_path)  # well-formed
        print(f"policy_sim --policy all: {len(rows)} CSV rows for {policies}; SVG parses")
        if len(rows) != want or len(policies) < 4 or bad:
            print(f"expected {want} rows with ratios in [0, 1] for >= 4 policies", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
