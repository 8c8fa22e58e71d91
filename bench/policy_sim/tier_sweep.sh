#!/usr/bin/env bash
# Runs the tier study of README.md ("adaptive"): every capacity host only (with Belady), then with a
# disk tier of each ratio running the host tier's policy, then with an LRU disk tier. One JSON object
# per line on stdout, each tiered one prefixed with "ratio" and "disk" (same | lru).
# Usage: bench/policy_sim/tier_sweep.sh POLICY_SIM CAPACITIES "RATIOS" [policy_sim flags: --trace ...]
# e.g.   bench/policy_sim/tier_sweep.sh build/bench/policy_sim/policy_sim 1000,1953,5859 "1 3" \
#            --trace ../shared/data/conversation_trace.jsonl > sweep.jsonl
set -euo pipefail
sim=$1 caps=$2 ratios=$3
shift 3
"$sim" "$@" --policy lru,prefix_lrfu,adaptive,belady --capacities "$caps" --json
for r in $ratios; do
  "$sim" "$@" --policy lru,prefix_lrfu,adaptive --capacities "$caps" --disk_ratio "$r" --json |
    sed "s/^{/{\"ratio\":$r,\"disk\":\"same\",/"
  "$sim" "$@" --policy prefix_lrfu,adaptive --disk_policy lru --capacities "$caps" --disk_ratio "$r" --json |
    sed "s/^{/{\"ratio\":$r,\"disk\":\"lru\",/"
done
