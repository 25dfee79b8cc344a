#!/bin/bash
# A lent GPU, first of two calls (from the repo root, carry .dev1; `bash benchmarks/gpu4/pack.sh` makes .dev1 and
# .dev2 and takes the shipped heads, data/ and docs/results out of the tree that travels). Keeps the default GGUF's
# first part, the shipped head and the packed training data in /tmp for call2.sh, then runs the CUDA tests.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
cp .dev1/gguf.part1 .dev1/synth.xz /tmp/ && rm -rf /tmp/head && cp -r .dev1/head /tmp/head || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev1/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout ${TESTS_S:-170} python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_graphs.py \
    tests/test_train_objective.py -k "cuda or flex" > $OUT/cuda_tests.log 2>&1
tail -2 $OUT/cuda_tests.log
grep -E "^(FAILED|ERROR)" $OUT/cuda_tests.log | cut -c1-200 | head -8
