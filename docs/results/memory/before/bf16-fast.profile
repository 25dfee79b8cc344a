# stage load_target                  done: VmRSS  4222 MB, VmHWM  4222 MB
# stage load_tokenizer               done: VmRSS  2120 MB, VmHWM  4222 MB
# stage ModelRunner.__init__         done: VmRSS  2632 MB, VmHWM  4222 MB
# stage LLMEngine.__init__           done: VmRSS  2632 MB, VmHWM  4222 MB
# stage LLMEngine.generate           done: VmRSS  2636 MB, VmHWM  4222 MB

[none, cpu bfloat16 weights, bf16 dot products, avx512 kernels] 16 tokens in 1.89s (8.47 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 4220 MB at 7.25 s in models/quant.py:pack_bf16:154; VmHWM 4222 MB; at the end RssAnon 636 MB, RssFile 174 MB
   0.00    376 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.02     13 MB  engine/auto_k.py:<module>:29
   0.02     13 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.03    227 MB  engine/tree.py:<module>:24
   1.45    228 MB  kernels/__init__.py:<module>:25
   1.46    375 MB  models/attention.py:<module>:18
   3.51    375 MB  models/attention.py:<module>:21
   3.52    375 MB  models/layers.py:<module>:15
   3.53    375 MB  models/quant.py:<module>:31
   3.54    376 MB  models/loader.py:<module>:22
   3.55    377 MB  models/loader.py:<module>:36
   3.55    377 MB  engine/model_runner.py:<module>:22
   3.56    377 MB  engine/expansion.py:<module>:65
   3.56    377 MB  engine/model_runner.py:<module>:24
   3.57    377 MB  engine/model_runner.py:<module>:26
   3.57    377 MB  engine/sequence.py:<module>:11
   3.58    380 MB  engine/detokenizer.py:<module>:11
   3.59    381 MB  engine/model_runner.py:<module>:73
   3.60    381 MB  engine/llm_engine.py:<module>:32
   3.61    381 MB  bench/attack.py:<module>:26
   3.62    381 MB  bench/serving.py:<module>:27
   3.62    381 MB  bench/serving.py:<module>:28
   3.63    381 MB  prompts.py:<module>:23
   3.63    383 MB  serve/limits.py:<module>:25
   3.66    383 MB  serve/limits.py:<module>:26
   3.67    385 MB  serve/requests.py:<module>:10
   3.69    391 MB  serve/requests.py:<module>:11
   3.77    391 MB  serve/requests.py:<module>:17
   3.77    400 MB  serve/responses.py:<module>:11
   3.98    400 MB  serve/responses.py:<module>:21
   3.99    400 MB  serve/requests.py:<module>:71
   4.00    402 MB  cli.py:build_parser:276
   4.00    401 MB  bench/baseline/runner.py:<module>:16
   4.01    401 MB  bench/baseline/runner.py:<module>:18
   4.02    401 MB  bench/baseline/runner.py:<module>:20
   4.03    402 MB  bench/sweep.py:<module>:23
   4.04    402 MB  cli.py:build_parser:313
   4.05    402 MB  cli.py:_add_train_args:253
   4.05    402 MB  train/trainer.py:<module>:36
   4.05    402 MB  train/data.py:<module>:22
   4.06    402 MB  cli.py:build_parser:417
   4.07    402 MB  cli.py:build_parser:438
   4.07    403 MB  kernels/__init__.py:available:75
   4.07    405 MB  models/layers.py:__init__:98
   4.08    406 MB  models/layers.py:rope_frequencies:142
   4.08    411 MB  models/checkpoint.py:read_safetensors:49
   4.09    416 MB  models/checkpoint.py:split_checkpoint:96
   4.09   2242 MB  models/checkpoint.py:fuse_checkpoint:73
   4.86   2247 MB  models/llama.py:load_checkpoint:298
   4.87   2838 MB  models/layers.py:set_precision:83
   5.16   4220 MB  models/quant.py:pack_bf16:154   <- peak
   5.19   3697 MB  models/quant.py:pack_model:281
   5.63   3107 MB  models/quant.py:pack_model:274
   6.67   3775 MB  models/quant.py:pack_model:278
   6.74   4014 MB  models/quant.py:pack_model:285
   6.93   4025 MB  models/quant.py:<genexpr>:286
   7.43   2044 MB  models/loader.py:load_tokenizer:219
   8.95   2120 MB  models/loader.py:load_tokenizer:220
   9.70   2613 MB  models/attention.py:__init__:271
   9.72   2626 MB  models/attention.py:__init__:272
  10.05   2632 MB  engine/llm_engine.py:from_pretrained:137
  10.06   2632 MB  prompts.py:encode:136
  10.06   2636 MB  models/layers.py:table:193
  10.07   2636 MB  models/llama.py:native_stack:399
  10.36   2635 MB  models/llama.py:hidden:366
  10.36   2636 MB  models/layers.py:linear:26
  10.37   2636 MB  models/layers.py:table:192
  11.10   2636 MB  models/quant.py:rows:220
  11.53   2636 MB  engine/model_runner.py:run:162
