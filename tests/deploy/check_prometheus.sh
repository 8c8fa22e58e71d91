#!/usr/bin/env bash
# deploy/prometheus and deploy/grafana: `promtool check rules`, the rules' unit tests (`promtool test
# rules prometheus_rules_test.yaml`), the Grafana dashboard's structure and every one of its PromQL
# queries parsed by promtool. (That each kvtier_* name exists on a live server's /metrics is checked by
# tests/integration/metrics_test.cc.) Exits 77 (ctest: skipped) without promtool.
# Usage: check_prometheus.sh SOURCE_DIR
set -euo pipefail
SRC=$(cd "$1" && pwd)
if ! command -v promtool >/dev/null; then
  echo "promtool not installed (Debian package prometheus; scripts/install-deps.sh): skipped"
  exit 77
fi
promtool check rules "$SRC/deploy/prometheus/kvtier-rules.yaml"
(cd "$SRC/tests/deploy" && promtool test rules prometheus_rules_test.yaml)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$SRC/deploy/grafana/kvtier-dashboard.json" "$work/dashboard-rules.json" <<'PY'
import json, sys
dash = json.load(open(sys.argv[1]))
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
need(dash.get("uid") and dash.get("title"), "dashboard needs a uid and a title")
names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
need("datasource" in names and "instance" in names, "dashboard needs the datasource and instance variables")
panels = [p for p in dash["panels"] if p["type"] != "row"]
ids = [p["id"] for p in dash["panels"]]
need(len(ids) == len(set(ids)), "panel ids repeat")
rules, titles = [], []
for p in panels:
    titles.append(p["title"].lower())
    need(p.get("datasource", {}).get("uid") == "${datasource}", f"panel {p['title']}: datasource must be ${{datasource}}")
    need(p.get("targets"), f"panel {p['title']}: no queries")
    for t in p.get("targets", []):
        expr = t["expr"].replace("$__rate_interval", "5m").replace("$instance", ".*")
        need("$" not in expr, f"panel {p['title']}: unknown variable in {t['expr']}")
        rules.append({"record": f"dashboard:panel_{p['id']}_{t['refId']}", "expr": expr})
# What the dashboard must show (DESIGN.md §8).
for want in ["hit ratio", "usage vs capacity", "evictions", "rejections", "p50 / p99", "checksum failures"]:
    need(any(want in t for t in titles), f"no panel about {want}")
need(any("kvtier_rpc_duration_seconds_bucket" in r["expr"] and "0.99" in r["expr"] for r in rules), "no p99 latency query")
need(any("kvtier_rpc_duration_seconds_bucket" in r["expr"] and "0.5" in r["expr"] for r in rules), "no p50 latency query")
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
for p in problems:
    print("PROBLEM:", p, file=sys.stderr)
print(f"dashboard: {len(panels)} panels, {len(rules)} queries")
sys.exit(1 if problems else 0)
PY
# Every dashboard query must be valid PromQL: promtool parses them as recording rules.
promtool check rules "$work/dashboard-rules.json"
