"""Where a training step's time goes (run on the lent GPU by call2.sh, after the probe): the trainer as
`call2.sh` configures it, 2 warm-up steps, then 3 steps under torch.profiler; prints seconds a step, the
number of CUDA kernel launches a step, and the operators with the most self time.

    python train_profile.py MODEL.gguf DATA_DIR"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from peagle.train.trainer import Trainer, TrainConfig

cfg = TrainConfig(data=sys.argv[2], out="/tmp/profile-run", target=sys.argv[1], k=8, batch_size=32, micro_tokens=4096,
                  max_elements=16384, lr=1.5e-3, min_lr=1.5e-4, warmup_steps=100, eval_docs=64, seed=3, progress=False)
trainer = Trainer(cfg)
cuda = trainer.device.type == "cuda"
sync = torch.cuda.synchronize if cuda else (lambda: None)
for _ in range(2):
    trainer.train_step()
sync()
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
with profile(activities=acts) as prof:
    t0 = time.perf_counter()
    for _ in range(3):
        trainer.train_step()
    sync()
    dt = (time.perf_counter() - t0) / 3
events = prof.key_averages()
launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
print(f"{dt:.3f} s a step; {launches / 3:.0f} kernel launches a step")
print(events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=15, max_name_column_width=50))
