#!/usr/bin/env bash
# Checks, on a machine with an accelerator, every point that the CPU runs cannot settle: the NCCL/RCCL
# semantics the descriptors declare from the source (unmeasured until this runs), the controllers'
# hands-off-the-device rule, and torchrun's end of run. One line per item, in a fixed order, so two
# machines' outputs compare line by line:
#
#   device_check: <item> <PASS|FAIL|SKIP|INFO> <detail>
#
#   PASS  the item behaves as the suite and the descriptor say      FAIL  it does not (detail says how)
#   SKIP  it cannot be checked here (detail says why: most need 2 devices, one rank per device)
#   INFO  a measurement, no verdict (e.g. seconds per process-group reset)
#
# Items, in order: torchrun-exit-code, shared-dir-two-nodes (both on CPU ranks: launcher behaviour, not the
# device's), controllers-touch-no-device, symmetric-memory-probe, world-size-devices, wait-is-stream-ordered,
# async-work, init-modes, complex-gather-reduce-scatter, nonfinite-min-max, p2p-tags, p2p-non-contiguous,
# missing-rank-teardown, monitored-barrier, pending-work-ending, nan-check, dtensor-recovery, precompile-device-index, symm-collectives,
# symm-error-cases, group-reset-seconds. Then "device_check: done <passed> passed, <failed> failed, <skipped> skipped".
#
# With one device: world size 1 only (NCCL refuses two ranks on one GPU), so every item that needs a peer
# skips, saying so; the items that one rank shows (stream-ordered wait, async work, complex dtypes, the
# probes, the controller's device, the world size, the reset cost) and the CPU torchrun items run.
# Budget: under 8 minutes on one H200 (the torchrun items take about 2 of them).
#
#   bash bench/device_check.sh        # PYTHON=... the interpreter; OUT=... where reports go; LIMIT=... s per run
#   BACKEND=cpu COUNT=2 bash bench/device_check.sh   # a dry run of the plumbing on CPU ranks (no device verdicts)
# Exits 1 if any item failed, 2 when there is no accelerator (and no BACKEND=cpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python}
LIMIT=${LIMIT:-300}
OUT=${OUT:-$(mktemp -d -t conformance-device-check-XXXXXX)}
BACKEND=${BACKEND:-auto}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$BACKEND" = cpu ]; then
  count=${COUNT:-2}
else
  count=$("$PY" -c 'import torch; a = torch.accelerator; print(a.device_count() if a.is_available() else 0)')
  if [ "${count:-0}" -lt 1 ]; then
    echo "device_check: no accelerator here (torch.accelerator sees none); nothing to check" >&2
    exit 2
  fi
fi
"$PY" -c 'import torch
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
print(f"device_check: torch {torch.__version__}, nccl {nccl}")'
echo "device_check: $count device(s), backend $BACKEND, reports in $OUT"

passed=0 failed=0 skipped=0
line() {  # line ITEM STATUS DETAIL...
  local item=$1 status=$2; shift 2
  echo "device_check: $item $status $*"
  case $status in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; esac
}
lines_from() {  # lines_from FILE ITEM...: each ITEM's "<item> <status> <detail>" line that a check wrote to FILE, or a FAIL
  local file=$1 item status detail; shift
  for item in "$@"; do
    if read -r _ status detail < <(grep -m 1 "^$item " "$file"); then
      line "$item" "$status" "$detail"
    else
      line "$item" FAIL "the check failed: $(tail -n 1 "$file" | cut -c1-200)"
    fi
  done
}
needs() {  # needs ITEM N: true when this machine has N devices, else a SKIP line
  if [ "$count" -lt "$2" ]; then
    line "$1" SKIP "needs $2 devices (one rank per device); this machine has $count"
    return 1
  fi
}

# -- torchrun's end of run, on CPU ranks (the launcher's behaviour does not depend on the device) ---------
pytest_item() {  # pytest_item ITEM K-EXPRESSION: one test of tests/conformance/test_torchrun.py
  local log="$OUT/$1.log"
  if timeout "$LIMIT" "$PY" -m pytest tests/conformance/test_torchrun.py -q -p no:cacheprovider -k "$2" >"$log" 2>&1; then
    line "$1" PASS "$(tail -n 1 "$log")"
  else
    line "$1" FAIL "$(grep -m 1 -E '^E ' "$log" | cut -c1-200) (log: $log)"
  fi
}
pytest_item torchrun-exit-code "rank_0s_report and one-node"
pytest_item shared-dir-two-nodes "rank_0s_report and two-static"

# -- the controllers and the probes ------------------------------------------------------------------------
"$PY" - "$BACKEND" "$count" >"$OUT/controller.txt" 2>&1 <<'PYEOF'
import sys

import torch

from conformance.session import ConformanceSession, RunOptions, default_world_size

backend, count = sys.argv[1], int(sys.argv[2])
session = ConformanceSession.create(RunOptions(backend=backend, world_size=1))
try:
    symm, bf16 = session.capabilities.probes["symmetric_memory"], session.capabilities.probes["bf16"]
    touched = torch.cuda.is_available() and torch.cuda.is_initialized()
    print(f"controllers-touch-no-device {'FAIL' if touched else 'PASS'} torch.cuda.is_initialized() in the "
          f"controller after probing: {touched}; rank 0 answered bf16={bf16.available}")
    declared = session.descriptor.declares("symmetric_memory")
    status = "PASS" if symm.available == declared else "FAIL"
    print(f"symmetric-memory-probe {status} probed on rank 0 with backend "
          f"{session.descriptor.symmetric_memory_backend}: {symm.available} (declared {declared}) {symm.reason}")
    size = default_world_size(session.descriptor)
    want = count if session.descriptor.world_size == "devices" else session.descriptor.world_size
    print(f"world-size-devices {'PASS' if size == want else 'FAIL'} default world size {size} "
          f"(descriptor: {session.descriptor.world_size}, devices: {count})")
finally:
    session.close()
PYEOF
lines_from "$OUT/controller.txt" controllers-touch-no-device symmetric-memory-probe world-size-devices

# -- what Work.wait() means: is the work complete right after it? ----------------------------------------
if [ "$BACKEND" = cpu ]; then
  line wait-is-stream-ordered SKIP "CPU ranks: gloo's wait() blocks the host"
else
  "$PY" - >"$OUT/wait.txt" 2>&1 <<'PYEOF'
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from conformance.descriptors import load_descriptors
from conformance.detect import detect_backend

descriptor = detect_backend(load_descriptors())
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
device = torch.device(descriptor.device_type, 0)
torch.accelerator.set_device_index(0)
dist.init_process_group(descriptor.distributed_backend, rank=0, world_size=1, device_id=device,
                        timeout=timedelta(seconds=60))
a = torch.randn(4096, 4096, device=device)
for _ in range(20):  # keep the current stream busy: the collective's stream waits for it
    a = a @ a / 4096
work = dist.all_reduce(a, async_op=True)
work.wait()
right_after = work.is_completed()
torch.accelerator.synchronize()
declared = descriptor.semantics.wait_blocks_host
status = "PASS" if right_after == declared or (declared and right_after) else "FAIL"
print(f"wait-is-stream-ordered {status} is_completed() right after wait(): {right_after}, after a device "
      f"synchronize: {work.is_completed()} (declared wait_blocks_host: {declared})")
dist.destroy_process_group()
PYEOF
  lines_from "$OUT/wait.txt" wait-is-stream-ordered
fi

# -- the suite's own tests, one selection per item ---------------------------------------------------------
suite_item() {  # suite_item ITEM MIN_DEVICES WORLD SUITE K-EXPRESSION
  local item=$1 min=$2 world=$3 suite=$4 select=$5
  needs "$item" "$min" || return 0
  local report="$OUT/$item.json"
  timeout "$LIMIT" "$PY" -m conformance run --backend "$BACKEND" --world-size "$world" --rank-timeout 120 \
    --suite "$suite" --report "$report" -- -q -k "$select" >"$OUT/$item.log" 2>&1
  if [ ! -f "$report" ]; then
    line "$item" FAIL "no report: the run did not finish (log: $OUT/$item.log)"
    return 0
  fi
  local verdict
  verdict=$("$PY" - "$report" <<'PYEOF'
import json, sys
from collections import Counter
report = json.load(open(sys.argv[1]))
counts = Counter(t["outcome"] for t in report["tests"])
bad = [t for t in report["tests"] if t["outcome"] in ("failed", "error", "xpassed")]
shown = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
first = f"; first: {bad[0]['nodeid'].split('::')[-1]}: {(bad[0]['message'].splitlines() or [''])[0][:160]}" if bad else ""
print(("FAIL " if bad or not report["tests"] else "PASS ") + (shown or "nothing selected") + first)
PYEOF
)
  line "$item" "${verdict%% *}" "${verdict#* } (world size $world)"
}
one=1
two=$([ "$count" -ge 2 ] && echo "$count" || echo 2)
suite_item async-work 1 "$one" collectives "test_async"
suite_item init-modes 1 "$one" init_modes "test_eager_init or test_nonblocking_init"
suite_item complex-gather-reduce-scatter 1 "$one" collectives "(test_gather or test_reduce_scatter) and complex"
suite_item nonfinite-min-max 2 "$two" collectives "test_all_reduce_nonfinite"
suite_item p2p-tags 2 "$two" p2p "test_isend_irecv_tags"
suite_item p2p-non-contiguous 2 "$two" collective_layouts "test_view and isend_irecv"
suite_item missing-rank-teardown 2 "$two" process_groups "test_missing_rank and (skip or raise)"
suite_item monitored-barrier 2 "$two" process_groups "test_missing_rank and monitored_barrier"
suite_item pending-work-ending 2 "$two" process_groups "test_pending_work"
suite_item nan-check 2 "$two" process_groups "test_nan_check"
suite_item dtensor-recovery 2 "$two" dtensor "test_op and S0"
suite_item precompile-device-index 2 "$two" precompile "test_load_runs_without_compiling_and_matches or test_uneven_batches_across_ranks"
suite_item symm-collectives 2 "$two" symmetric_memory "real_buffers or sub_group or reaches_the_ops"
if needs symm-error-cases 2; then
  line symm-error-cases SKIP "declared mode: skip on this backend (a fault would take the rank's later tests with it); to measure it, run it alone with a descriptor copy (--backends-dir) whose known failure for it is removed"
fi

# -- what an expected-raise test costs: the process group is replaced after each ---------------------------
# The rank function lives in a module of its own: ranks import what they run by name, and a script read
# from standard input has none.
mkdir -p "$OUT/rank_functions"
cat >"$OUT/rank_functions/device_check_ranks.py" <<'PYEOF'
def raise_on_ranks(ctx, failing):
    if ctx.rank in failing:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    return ctx.rank
PYEOF
PYTHONPATH="$OUT/rank_functions:$PYTHONPATH" "$PY" - "$BACKEND" >"$OUT/reset.txt" 2>&1 <<'PYEOF'
import sys
import time

from conformance.ranks import RankError
from conformance.session import ConformanceSession, RunOptions
from device_check_ranks import raise_on_ranks

session = ConformanceSession.create(RunOptions(backend=sys.argv[1], world_size=1))
try:
    pool = session.pool(1)
    pool.start()
    start, n = time.monotonic(), 5
    for _ in range(n):
        try:
            pool.run(raise_on_ranks, [0])
        except RankError:
            pass
    print(f"group-reset-seconds INFO {(time.monotonic() - start) / n:.2f} s per failed call and process-group "
          f"reset at world size 1 ({session.descriptor.distributed_backend})")
finally:
    session.close()
PYEOF
lines_from "$OUT/reset.txt" group-reset-seconds

echo "device_check: done $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
