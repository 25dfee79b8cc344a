#!/bin/bash
# A lent GPU, third call (from the repo root, carry .dev3: the training data): the shipped head continued by NPROC
# torchrun processes on the one GPU (default 1: four sharing it over gloo gave 1.04x one, BENCHMARKS §43), BATCH
# documents each a step, for BUDGET seconds (what the lease has left, less a margin). A 12-step probe sizes the
# run; the head is exported compact in float16, in parts under $OUT. `BUDGET=540 bash benchmarks/gpu3/call3.sh`.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0 OMP_NUM_THREADS=2
START=$(date +%s); BUDGET=${BUDGET:-500}; LR=${LR:-1e-3}; NPROC=${NPROC:-1}; BATCH=${BATCH:-32}
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
rm -rf /tmp/synth && cp -r .dev3/synth /tmp/synth
train() {  # out, steps, flags
    timeout $TMO python3 -m torch.distributed.run --standalone --nproc_per_node $NPROC benchmarks/gpu/cli_lite.py \
        train --target $G --data /tmp/synth --method peagle --layers 1 -k 8 --batch-size $BATCH --micro-tokens 4096 \
        --max-elements 16384 --lr $LR --min-lr $(python3 -c "print($LR/10)") --warmup-steps 20 --eval-docs 64 \
        --seed 5 --no-progress --init-from /tmp/head --out $1 --max-steps $2 "${@:3}"
}
TMO=120 train /tmp/probe 12 --log-every 4 --eval-every 100000 --save-every 100000 --eval-docs 4 > $OUT/probe.log 2>&1
SPS=$(python3 -c "
import json
r=[json.loads(l) for l in open('/tmp/probe/train_log.jsonl') if '\"loss\"' in l]
print((r[-1]['elapsed_s']-r[0]['elapsed_s'])/(r[-1]['step']-r[0]['step']))")
[ -n "$SPS" ] || { tail -20 $OUT/probe.log; echo "the probe failed"; exit 1; }
LEFT=$((BUDGET - $(date +%s) + START - 80))   # 80 s: start-up, the last evaluation, export
STEPS=$(python3 -c "print(max(40, int($LEFT / ($SPS * 1.05))))")
echo "probe: $NPROC processes x $BATCH documents, $SPS s a step; $LEFT s left: $STEPS steps"
TMO=$((LEFT + 60)) train /tmp/run $STEPS --log-every 20 --eval-every 100000 --save-every 100 > $OUT/train.log 2>&1
cp /tmp/run/train_log.jsonl $OUT/train_log.jsonl
grep -v Warn $OUT/train.log | tail -2 | cut -c1-300
python3 benchmarks/gpu/cli_lite.py export --target $G --drafter /tmp/run --out /tmp/compact --compact \
    --dtype float16 2>&1 | tail -1
split -b 15M /tmp/compact/model.safetensors $OUT/head.safetensors.part-
cp /tmp/compact/config.json $OUT/head.config.json
