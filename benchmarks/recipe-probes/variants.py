"""Recipe probes (BENCHMARKS §9): `peagle train` with one change to the head or its optimisation,
chosen by environment variables, for side-by-side runs at equal compute. A measurement script, not
part of the package: each variant patches the trainer before the CLI runs.

  PRECOND=1     fc reads each tap dimension divided by its standard deviation (from 32 documents),
                the outlier features of the residual stream no longer dominating fc's output
  NBR=1         norm_before_residual = true (vLLM's flag): layer 0's residual is the normed hidden
  CHEAT=1       depth 0 reads the target's taps one position later, g[t+1] (not a drafter: a bound
                on how fast a head learns when the answer is three target layers away)
  LSINIT=1      fc starts as the least-squares map from taps g[a] to the target's final state at
                a+1 (divided by the final norm's weight), fitted on 256 training documents;
                ZERO=1 also zeroes o_proj and down_proj (the head starts as exactly that map);
                SLOW=s trains fc and lm_head at s times the learning rate
  FREEZE=names  comma list of parameters kept at their initial value (lm_head.weight: the target's)

usage: python variants.py <peagle train arguments>
"""
import os
import sys

import torch

from peagle.cli import main
from peagle.models import drafter as D
from peagle.train import objective as O
from peagle.train import trainer as T
from peagle.train.head import TrainHead

env = os.environ.get

if env("NBR") == "1":
    _cfg = D.DrafterConfig.for_target.__func__

    def _for_target(cls, *a, **k):
        c = _cfg(cls, *a, **k)
        c.norm_before_residual = True
        return c
    D.DrafterConfig.for_target = classmethod(_for_target)

if env("PRECOND") == "1":
    SCALE = {}
    TrainHead.project = lambda self, taps: self.fc(taps * SCALE["s"])
    TrainHead.mask_feature = lambda self: self.fc(self.mask_hidden.reshape(1, -1) * SCALE["s"])[0]
    _init_p = T.Trainer.__init__

    def _init_precond(self, cfg):
        from peagle.models.loader import load_target
        from peagle.train.data import HiddenSource, load_records
        tgt, _ = load_target(cfg.target, "float32", device="cpu")
        src = HiddenSource(tgt, cfg.hidden)
        recs = [r for r in load_records(cfg.data, cfg.max_len) if src.has(r)][:32]
        SCALE["s"] = 1.0 / torch.cat([src.doc(r).taps[1:] for r in recs]).std(0).clamp(min=1e-3)
        _init_p(self, cfg)
    T.Trainer.__init__ = _init_precond

if env("CHEAT") == "1":
    _hidden = O.Objective.hidden

    def _hidden_next(self, batch, el):
        taps = torch.cat([batch.taps[1:], batch.taps[-1:]])
        return _hidden(self, O.Batch(**{**batch.__dict__, "taps": taps}), el)
    O.Objective.hidden = _hidden_next

if env("LSINIT") == "1":
    _init_ls = T.Trainer.__init__

    def _init_lstsq(self, cfg):
        _init_ls(self, cfg)
        if self.step > 0:  # resumed
            return
        head, W = self.head, self.target.model.norm.weight.float()
        docs = [self.source.doc(r) for r in self.train_records[:256]]
        X = torch.cat([d.taps[1:-1] for d in docs])
        Y = torch.cat([d.final[2:] / W for d in docs])
        sol = torch.linalg.solve(X.T @ X + 10 * torch.eye(X.shape[1]), X.T @ Y)
        with torch.no_grad():
            head.fc.weight.copy_(sol.T)
            if env("ZERO") == "1":
                for name, p in head.named_parameters():
                    if name.endswith(("o_proj.weight", "down_proj.weight")):
                        p.zero_()
        slow = float(env("SLOW", "1"))
        if slow != 1:
            # the trainer's own optimizer, fc and lm_head moved into a second group at lr * slow
            moved = [p for n, p in head.named_parameters() if p.requires_grad and n in ("fc.weight", "lm_head.weight")]
            group = self.opt.param_groups[0]
            group["params"] = [p for p in group["params"] if all(p is not q for q in moved)]
            self.opt.add_param_group({"params": moved, "lr": cfg.lr * slow})
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, T.lr_lambda(cfg, self.total_steps))
    T.Trainer.__init__ = _init_lstsq

if env("FREEZE"):
    frozen = env("FREEZE").split(",")
    _head = TrainHead.for_target.__func__

    def _for_target_frozen(cls, *a, **k):
        h = _head(cls, *a, **k)
        for n, p in h.named_parameters():
            if n in frozen:
                p.requires_grad_(False)
        return h
    TrainHead.for_target = classmethod(_for_target_frozen)

sys.exit(main(["train", *sys.argv[1:]]))
