#!/usr/bin/env bash
# Regenerates tests/data/plans/smollm2-135m-cpu: a plan written by `tkcc optimize --model smollm2-135m`
# on this CPU (offline agents, the bundled Azure trace), that tests/compiler/test_serve.py serves with
# the real SmolLM2 weights to check greedy output is identical with and without it.
# Run it (`make smollm2-plan`) when that test says the committed plan no longer loads: plan.json's
# schema or an op's signature changed. Cost: BUDGET (default 12m) of CPU time. Only plan.json and
# kernels/ are kept (the files `compiler.plan.load` verifies by sha256); it fails if nothing was accepted.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m compiler optimize --model smollm2-135m --hw cpu --traffic examples/traffic/azure2023_conv.parquet \
    --budget "${BUDGET:-12m}" --agents offline:2 --device cpu --max-points 1 --slow-layers 2 \
    --out "$work/plan" --fresh --quiet
dest=tests/data/plans/smollm2-135m-cpu
"$PY" - "$work/plan/v1" <<'PYEOF'
import sys
from compiler import plan
p, _ = plan.load(sys.argv[1])
if not p.optimizations:
    sys.exit("smollm2_plan: tkcc optimize accepted nothing; run again with a larger BUDGET")
print(f"smollm2_plan: {len(p.optimizations)} optimization(s): {', '.join(o.name for o in p.optimizations)}")
PYEOF
rm -rf "$dest"
mkdir -p "$dest/v1"
cp "$work/plan/v1/plan.json" "$dest/v1/"
cp -r "$work/plan/v1/kernels" "$dest/v1/"
"$PY" -c "from compiler import plan; plan.load('$dest')" && echo "smollm2_plan: wrote $dest/v1"
