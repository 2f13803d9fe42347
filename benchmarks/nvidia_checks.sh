#!/usr/bin/env bash
# Every check of the NVIDIA issue on a GPU node, in one go, into one folder:
#
#   benchmarks/nvidia_checks.sh OUTDIR [tests|eager|compile|all]
#
# tests   : the gpu-marked tests (tests/test_nvidia_gpu.py)          -> OUTDIR/gpu-tests.log
# eager   : benchmark cases resnet50, fcnn, meter                      -> OUTDIR/bench-<case>.json, bench-eager.log
# compile : benchmark case resnet50-compile (minutes of compilation)  -> OUTDIR/bench-compile.json, .log
# all     : the three (default)
#
# Uses the python3 on PATH, which must already hold core's dependencies, a CUDA build of PyTorch,
# nvidia-ml-py and (for the ResNet-50 reference loop) torchvision. Each part writes its files as it
# goes, so a part that fails or is stopped keeps what the earlier ones measured.
set -uo pipefail

out=${1:?usage: benchmarks/nvidia_checks.sh OUTDIR [tests|eager|compile|all]}
part=${2:-all}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
export PYTHONUNBUFFERED=1
status=0

python3 - <<'EOF' | tee "$out/node.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(i, torch.cuda.get_device_name(i))
EOF

if [[ $part == tests || $part == all ]]; then
    python3 -m pytest -p no:cacheprovider -q -rs tests/test_nvidia_gpu.py 2>&1 | tee "$out/gpu-tests.log"
    (( PIPESTATUS[0] == 0 )) || status=1
fi
if [[ $part == eager || $part == all ]]; then
    for case in resnet50 fcnn meter; do
        python3 benchmarks/nvidia_vs_plain.py --case "$case" --json "$out/bench-$case.json" 2>&1 \
            | tee -a "$out/bench-eager.log"
        (( PIPESTATUS[0] == 0 )) || status=1
    done
fi
if [[ $part == compile || $part == all ]]; then
    python3 benchmarks/nvidia_vs_plain.py --case resnet50-compile --repeats 2 --json "$out/bench-compile.json" 2>&1 \
        | tee "$out/bench-compile.log"
    (( PIPESTATUS[0] == 0 )) || status=1
fi
exit $status
