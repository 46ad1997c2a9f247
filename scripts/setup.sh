#!/usr/bin/env bash
# Set up ./.venv with gpufeed and its own dependencies; with --test, also the test tools and the
# libraries the integrations are tested against (Lightning, transformers, TensorFlow for CPU, Ray:
# about 2 GB), which a user who wants the demo does not need.
#
# torch: a torch already in the venv is kept as it is (users bring their own CUDA build);
# otherwise torch==2.13.0 is installed, the CPU build that lies on disk on the project's machines.
# Set GPUFEED_TORCH to install another version instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras=""
case "${1:-}" in
    "") ;;
    --test) extras="[test]" ;;
    *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet "torch==${GPUFEED_TORCH:-2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".${extras}"
.venv/bin/python -c "import gpufeed, torch; print(f'gpufeed {gpufeed.__version__} ready (torch {torch.__version__})')"
