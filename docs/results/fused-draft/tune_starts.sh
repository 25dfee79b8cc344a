# The tile shape each engine start chooses (kernels.tune_streaming), N fresh processes in a row:
#   bash docs/results/fused-draft/tune_starts.sh 6
for i in $(seq "${1:-6}"); do
  .venv/bin/python -c "
from peagle.engine.llm_engine import LLMEngine
import torch
LLMEngine.from_pretrained(None, max_num_seqs=1)
print(tuple(torch.ops.peagle.stream_bytes()))" 2>&1 | grep -v '^peagle'
done
