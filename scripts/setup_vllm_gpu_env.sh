#!/usr/bin/env bash
# Creates .venv-vllm033 (or .venv-vllm034): vLLM 0.33.0's (0.34.0's) own Python, the CUDA wheel installed without
# its CUDA libraries, beside the CPU torch, for the contract and config-level tests of the GPU code paths
# (`pytest -m vllm_contract`).
# Nothing in it runs a kernel: the wheel's compiled extensions need torch 2.14 and CUDA, and are never loaded.
# Idempotent: a second run only checks what is there (a second).
# Usage: scripts/setup_vllm_gpu_env.sh [0.33.0 | 0.34.0]   (default 0.33.0)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VLLM_VERSION=${1:-0.33.0}
case "$VLLM_VERSION" in
  0.33.0) VENV=${SPEC_PLUGINS_VLLM_GPU_VENV:-$ROOT/.venv-vllm033} ;;
  0.34.0) VENV=${SPEC_PLUGINS_VLLM034_VENV:-$ROOT/.venv-vllm034} ;;
  *) echo "[setup-gpu] vLLM version: expected 0.33.0 or 0.34.0, got $VLLM_VERSION" >&2; exit 2 ;;
esac
TORCH_VERSION=2.13.0
PY=${PYTHON:-python3}
STAMP="$VENV/.spec-plugins-setup"
want="vllm=$VLLM_VERSION;torch=$TORCH_VERSION;setup=$(sha1sum "$0" | cut -c1-12);pyproject=$(sha1sum pyproject.toml | cut -c1-12)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c 'import vllm, spec_plugins' 2>/dev/null; then
  echo "[setup-gpu] $VENV is up to date"
  exit 0
fi

pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
[ -x "$VENV/bin/python" ] || { echo "[setup-gpu] creating $VENV"; "$PY" -m venv "$VENV"; pip_install --upgrade pip setuptools wheel; }

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
echo "[setup-gpu] downloading vllm==$VLLM_VERSION (the CUDA wheel, ~340 MB; only its Python is used)"
"$VENV/bin/python" -m pip download -q --disable-pip-version-check --progress-bar off --no-deps \
  -d "$WHEELS" "vllm==$VLLM_VERSION" 2> >(grep -v "is ignored" >&2)

# The wheel's requirements less torch and everything that exists only for CUDA (kernels, NVIDIA libraries,
# codecs); pip evaluates the markers. Those left are the pure-Python packages its modules import.
"$VENV/bin/python" - "$WHEELS"/vllm-*.whl > "$WHEELS/requirements.txt" <<'EOF'
import re, sys, zipfile
CUDA_ONLY = re.compile(r"^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer.*|apache-tvm-ffi|tilelang|"
                       r"nvidia-.*|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed-mla|humming-kernels)$")
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    for line in whl.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line[len("Requires-Dist: "):]
        if "extra ==" in req:
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-")
        if not CUDA_ONLY.match(name):
            print(req)
EOF
echo "[setup-gpu] installing torch $TORCH_VERSION (CPU) and vLLM $VLLM_VERSION's pure-Python requirements"
pip_install "torch==$TORCH_VERSION"
pip_install -r "$WHEELS/requirements.txt" "torch==$TORCH_VERSION"
pip_install --no-deps "$WHEELS"/vllm-*.whl
if [ "$VLLM_VERSION" = 0.34.0 ]; then
  # 0.34's Triton-decorated modules run Triton's own code at import once vLLM reports Triton present (as it does on
  # the stand-in CUDA platform of the config tests): the real package, not vLLM's placeholder. No kernel runs.
  pip_install --no-deps "triton==3.9.0"
fi
# The compiled cores build here as in .venv; the package's extras are not needed by the contract tests.
echo "[setup-gpu] installing spec-plugins (editable)"
PYTHONWARNINGS="ignore:Editable installation" pip_install -e . "torch==$TORCH_VERSION" pytest
"$VENV/bin/python" -W ignore -c 'import vllm, spec_plugins; print("[setup-gpu] vllm", vllm.__version__, "| spec_plugins", spec_plugins.__version__)' 2>&1 \
  | grep -v "Failed to import from vllm._C"
echo "$want" > "$STAMP"
