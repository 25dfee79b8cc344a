#!/bin/bash
# A lent GPU, first call (from the repo root): the CUDA tests. The call also carries .dev1 (the gguf wheel
# and the default GGUF's first 58 MB) for call2.sh, as one call's tree may hold 64 MiB; a carried folder the
# next call does not carry is removed there, so its files go to /tmp, which lasts while the machine is warm.
cp .dev1/gguf.part1 .dev1/*.whl /tmp/ || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_graphs.py tests/test_expansion.py \
    tests/test_tree_attention.py 2>&1 | tee $OUT/cuda_tests.log
