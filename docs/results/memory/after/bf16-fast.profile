# stage load_tokenizer               done: VmRSS   355 MB, VmHWM   408 MB
# stage load_target                  done: VmRSS  1970 MB, VmHWM  2402 MB
# stage ModelRunner.__init__         done: VmRSS  1970 MB, VmHWM  2402 MB
# stage LLMEngine.__init__           done: VmRSS  1970 MB, VmHWM  2402 MB
# stage LLMEngine.generate           done: VmRSS  1989 MB, VmHWM  2402 MB

[none, cpu bfloat16 weights, bf16 dot products, avx512 kernels] 16 tokens in 1.89s (8.47 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 2400 MB at 10.73 s in models/quant.py:pack_bf16_rows:318; VmHWM 2402 MB; at the end RssAnon 909 MB, RssFile 106 MB
   0.01    235 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.02     13 MB  engine/auto_k.py:<module>:29
   0.02     13 MB  engine/auto_k.py:<module>:30
   0.02     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.03    227 MB  engine/tree.py:<module>:24
   1.62    228 MB  kernels/__init__.py:<module>:25
   1.63    230 MB  models/attention.py:<module>:22
   1.64    230 MB  models/attention.py:<module>:23
   1.65    230 MB  models/loader.py:<module>:22
   1.66    231 MB  models/loader.py:<module>:26
   1.67    231 MB  models/loader.py:<module>:36
   1.69    231 MB  engine/model_runner.py:<module>:25
   1.69    231 MB  engine/model_runner.py:<module>:26
   1.69    231 MB  engine/sampling.py:<module>:18
   1.70    231 MB  engine/sequence.py:<module>:11
   1.70    234 MB  engine/detokenizer.py:<module>:11
   1.71    235 MB  engine/model_runner.py:<module>:30
   1.72    235 MB  engine/llm_engine.py:<module>:32
   1.73    235 MB  bench/attack.py:<module>:17
   1.73    235 MB  bench/attack.py:<module>:19
   1.73    236 MB  bench/attack.py:<module>:26
   1.75    236 MB  bench/serving.py:<module>:27
   1.76    236 MB  bench/serving.py:<module>:28
   1.76    236 MB  bench/attack.py:<module>:30
   1.77    237 MB  serve/limits.py:<module>:25
   1.97    237 MB  serve/limits.py:<module>:26
   1.97    238 MB  serve/limits.py:<module>:28
   1.98    240 MB  serve/requests.py:<module>:10
   2.01    246 MB  serve/requests.py:<module>:11
   2.10    246 MB  serve/requests.py:<module>:17
   2.10    255 MB  serve/responses.py:<module>:11
   2.36    256 MB  serve/responses.py:<module>:15
   2.36    256 MB  serve/responses.py:<module>:21
   2.37    256 MB  serve/requests.py:<module>:71
   2.38    256 MB  serve/requests.py:<module>:211
   2.38    257 MB  bench/baseline/runner.py:<module>:16
   2.39    257 MB  bench/baseline/runner.py:<module>:18
   2.40    257 MB  bench/baseline/runner.py:<module>:19
   2.40    257 MB  cli.py:build_parser:276
   2.42    257 MB  bench/sweep.py:<module>:23
   2.42    257 MB  cli.py:build_parser:280
   2.43    257 MB  cli.py:build_parser:413
   2.44    257 MB  cli.py:_add_train_args:253
   2.44    258 MB  train/trainer.py:<module>:36
   2.45    258 MB  train/trainer.py:<module>:37
   2.45    258 MB  cli.py:build_parser:417
   2.46    258 MB  cli.py:build_parser:438
   2.46    258 MB  kernels/__init__.py:available:75
   2.47    284 MB  models/loader.py:load_tokenizer:223
   4.00    408 MB  models/loader.py:load_tokenizer:225
   6.25   1970 MB  runtime.py:trim_heap:66
   6.26    357 MB  models/layers.py:__init__:98
   6.27    361 MB  models/llama.py:make_rotary:249
   6.28   1964 MB  models/checkpoint.py:_read_tensor:76
   6.88   1749 MB  models/checkpoint.py:_read_tensor:71
   7.18   1397 MB  models/checkpoint.py:read_safetensors:61
   7.68   1968 MB  models/checkpoint.py:check_checkpoint:27
   7.68   2040 MB  models/checkpoint.py:fuse_checkpoint:100
   8.47   1985 MB  models/llama.py:load_checkpoint:300
   8.47   1985 MB  models/layers.py:set_fast_layout:71
   8.48   2375 MB  models/layers.py:set_precision:83
   8.79   2376 MB  models/layers.py:set_precision:80
   8.82   2182 MB  kernels/__init__.py:int_isa:131
   8.82   2373 MB  models/quant.py:pack_bf16:169
   9.78   2201 MB  models/quant.py:pack_model:297
   9.79   2193 MB  models/quant.py:pack_model:290
   9.96   2188 MB  models/quant.py:pack_model:294
  10.35   2373 MB  models/quant.py:pack_bf16_rows:315
  10.36   2400 MB  models/quant.py:pack_bf16_rows:318   <- peak
  10.37   2398 MB  models/quant.py:pack_bf16_rows:316
  10.65   2357 MB  models/quant.py:pack_bf16:168
  11.15   1970 MB  prompts.py:render:128
  11.15   1988 MB  models/quant.py:rows:235
  11.15   1989 MB  models/llama.py:native_stack:403
  11.46   1989 MB  models/layers.py:linear:26
  11.47   1988 MB  engine/model_runner.py:run:162
  11.89   1988 MB  models/layers.py:table:196
  12.20   1989 MB  models/quant.py:rows:233
  12.31   1989 MB  models/attention.py:slots:154
  12.61   1989 MB  engine/tree.py:accept_paths:196
