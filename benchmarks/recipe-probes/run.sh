#!/bin/bash
# Recipe probes at equal compute (BENCHMARKS §9): 1-layer P-EAGLE heads, K=8, soft labels, on the
# first 1,024 synthesized documents (985 trained, 39 held out by id hash), float32 (this AVX2-only
# CPU has no native bf16), one thread each, two runs side by side. Each run sees 391k document
# tokens: 250 steps x 4 documents, or 1,000 steps x 1 document for the batch-size probe.
cd "$(dirname "$0")/../../.."   # the repository root
mkdir -p /tmp/snap runs/exp
cp data/synth/smollm2-135m-instruct/responses-0000[01].jsonl.gz /tmp/snap/
.venv/bin/peagle hidden --data /tmp/snap --out runs/hidden-snap --dtype float32 &
until [ -f runs/hidden-snap/hidden-00003.safetensors ]; do sleep 10; done
kill -INT %1; wait

probe() {  # probe NAME "VAR=value ..." [train arguments]
  local name=$1 vars=$2; shift 2
  env PEAGLE_TORCH_THREADS=1 $vars .venv/bin/python benchmarks/recipe-probes/variants.py \
    --data /tmp/snap --hidden runs/hidden-snap --out runs/exp/$name --method peagle --layers 1 -k 8 \
    --batch-size 4 --lr 1e-3 --min-lr 1e-4 --warmup-steps 25 --max-steps 250 --eval-every 125 \
    --eval-docs 64 --eval-fraction 0.05 --save-every 50 --log-every 25 --seed 1 --no-progress "$@" \
    > runs/exp/$name.log 2>&1
  cp runs/exp/$name/train_log.jsonl docs/results/recipe-probes/$name.jsonl
}
probe base "" & probe precond "PRECOND=1" & wait
probe cheat "CHEAT=1" & probe nbr "NBR=1" & wait
probe lsz-slow "LSINIT=1 ZERO=1 SLOW=0.1" & probe lsz-lr3e-4 "LSINIT=1 ZERO=1" --lr 3e-4 & wait   # lsz-slow stopped after step 125
probe freeze-lm "FREEZE=lm_head.weight" & probe bs1 "" --batch-size 1 --max-steps 1000 --warmup-steps 100 --eval-every 500 & wait

# Continuing the shipped head over all synthesized documents (online target states, two threads):
# first with one document a step at lr 1e-3 (stopped at step 500), then four a step at lr 3e-4.
.venv/bin/python benchmarks/recipe-probes/eval_head.py peagle/heads/SmolLM2-135M-Instruct /tmp/evh  # before any step
cont="--data data/synth/smollm2-135m-instruct --method peagle --layers 1 -k 8 --init-from peagle/heads/SmolLM2-135M-Instruct \
  --eval-docs 48 --seed 2 --no-progress"
.venv/bin/peagle train $cont --out runs/p1e3-lr1e-3-bs1 --batch-size 1 --lr 1e-3 --min-lr 1e-4 --warmup-steps 100 \
  --max-steps 6000 --eval-every 500 --save-every 100 --log-every 50
.venv/bin/peagle train $cont --out runs/p1e3 --batch-size 4 --lr 3e-4 --min-lr 3e-5 --warmup-steps 50 \
  --max-steps 1000 --eval-every 250 --save-every 50 --log-every 25 --resume
d=docs/results/recipe-probes
cp runs/p1e3-lr1e-3-bs1/train_log.jsonl $d/continue-bs1-lr1e-3.jsonl; cp runs/p1e3/train_log.jsonl $d/continue-lr3e-4.jsonl
