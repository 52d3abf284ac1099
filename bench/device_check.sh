#!/usr/bin/env bash
# Runs every conformance suite on this machine's accelerator: at world size 1, at the device count, and at
# the device count under torchrun (one launcher process per device). Prints each run's per-suite table and
# every unexpected result (failed, error, xpassed) with its message; exits 1 if any run had one, 2 when
# there is no accelerator. Reports land in $OUT (default: a new temporary directory).
#
#   bash bench/device_check.sh            # PYTHON=... picks the interpreter, LIMIT=... seconds per run
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python}
LIMIT=${LIMIT:-900}
OUT=${OUT:-$(mktemp -d -t conformance-device-check-XXXXXX)}
mkdir -p "$OUT"

count=$("$PY" -c 'import torch; a = torch.accelerator; print(a.device_count() if a.is_available() else 0)')
if [ "${count:-0}" -lt 1 ]; then
  echo "device_check: no accelerator here (torch.accelerator sees none); nothing to check" >&2
  exit 2
fi
"$PY" -c 'import torch; a = torch.accelerator.current_accelerator(); print(f"device_check: {torch.accelerator.device_count()} {a.type} device(s), torch {torch.__version__}")'
"$PY" -m conformance backends || true

unexpected() {  # the unexpected results of one report, one per line with the first line of its message
  "$PY" - "$1" <<'PYEOF'
import json, sys
report = json.load(open(sys.argv[1]))
bad = [t for t in report["tests"] if t["outcome"] in ("failed", "error", "xpassed")]
for t in bad:
    first = (t["message"].splitlines() or [""])[0][:300]
    ranks = "; ".join(f"rank {r['rank']} {r['outcome']}" for r in t.get("ranks", []) if r["outcome"] != "passed")
    print(f"  {t['outcome']:7} {t['nodeid']}: {first}" + (f"  [{ranks}]" if ranks else ""))
print(f"  {len(bad)} unexpected of {len(report['tests'])}")
sys.exit(1 if bad else 0)
PYEOF
}

status=0
run() {  # run NAME COMMAND...: one run, its table, its unexpected results
  local name=$1; shift
  echo
  echo "=== $name ==="
  local start=$SECONDS
  timeout "$LIMIT" "$@" --report "$OUT/$name.json" -- -q --rank-timeout 120 | tail -n 15
  echo "($name: $((SECONDS - start)) s; exit ${PIPESTATUS[0]})"
  if [ -f "$OUT/$name.json" ]; then
    unexpected "$OUT/$name.json" || status=1
  else
    echo "  no report: the run did not finish (timeout or crash)"
    status=1
  fi
}

run world-size-1 "$PY" -m conformance run --world-size 1
if [ "$count" -gt 1 ]; then
  run "world-size-$count" "$PY" -m conformance run --world-size "$count"
  run "torchrun-$count" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$count" -m conformance run
fi
echo
echo "device_check: reports in $OUT"
exit $status
