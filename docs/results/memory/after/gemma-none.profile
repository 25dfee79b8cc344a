# stage load_tokenizer               done: VmRSS   413 MB, VmHWM   845 MB
# stage load_target                  done: VmRSS   691 MB, VmHWM   845 MB
# stage ModelRunner.__init__         done: VmRSS   692 MB, VmHWM   845 MB
# stage LLMEngine.__init__           done: VmRSS   692 MB, VmHWM   845 MB
# stage LLMEngine.generate           done: VmRSS   704 MB, VmHWM   845 MB

[none, cpu GGUF Q4_K/Q5_0/Q6_K/Q8_0 weights, int8 compute, avx512 kernels] 128 tokens in 3.69s (34.71 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 773 MB at 9.23 s in models/loader.py:load_tokenizer:225; VmHWM 845 MB; at the end RssAnon 401 MB, RssFile 108 MB
   0.00    235 MB  (outside peagle)
   0.01     13 MB  cli.py:<module>:5
   0.02     13 MB  engine/auto_k.py:<module>:29
   0.02     13 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.04    227 MB  engine/tree.py:<module>:24
   1.59    228 MB  kernels/__init__.py:<module>:25
   1.60    230 MB  models/attention.py:<module>:22
   1.61    230 MB  models/layers.py:<module>:15
   1.63    230 MB  models/loader.py:<module>:22
   1.64    231 MB  models/loader.py:<module>:36
   1.64    231 MB  engine/model_runner.py:<module>:22
   1.65    231 MB  engine/expansion.py:<module>:22
   1.66    231 MB  engine/grammar.py:<module>:49
   1.66    231 MB  engine/model_runner.py:<module>:27
   1.67    234 MB  engine/detokenizer.py:<module>:11
   1.67    234 MB  engine/model_runner.py:<module>:30
   1.69    235 MB  engine/llm_engine.py:<module>:32
   1.69    235 MB  bench/attack.py:<module>:17
   1.70    235 MB  bench/attack.py:<module>:19
   1.71    236 MB  bench/attack.py:<module>:26
   1.71    236 MB  bench/serving.py:<module>:27
   1.72    236 MB  bench/serving.py:<module>:28
   1.73    236 MB  bench/attack.py:<module>:30
   1.73    237 MB  serve/limits.py:<module>:25
   1.93    238 MB  serve/limits.py:<module>:28
   1.94    240 MB  serve/requests.py:<module>:10
   1.97    246 MB  serve/requests.py:<module>:11
   2.05    246 MB  serve/requests.py:<module>:17
   2.05    255 MB  serve/responses.py:<module>:11
   2.29    256 MB  serve/responses.py:<module>:21
   2.30    256 MB  serve/requests.py:<module>:71
   2.31    257 MB  cli.py:build_parser:276
   2.31    256 MB  bench/baseline/runner.py:<module>:16
   2.32    256 MB  bench/baseline/runner.py:<module>:18
   2.33    257 MB  bench/baseline/runner.py:<module>:19
   2.35    257 MB  bench/sweep.py:<module>:23
   2.36    257 MB  cli.py:build_parser:283
   2.36    257 MB  cli.py:_add_train_args:253
   2.37    258 MB  train/trainer.py:<module>:36
   2.38    258 MB  train/trainer.py:<module>:37
   2.38    258 MB  cli.py:build_parser:417
   2.39    258 MB  cli.py:build_parser:438
   2.39    258 MB  kernels/__init__.py:available:75
   2.40    284 MB  models/loader.py:load_tokenizer:223
   3.86    773 MB  models/loader.py:load_tokenizer:225   <- peak
   9.92    692 MB  runtime.py:trim_heap:66
   9.94    413 MB  models/layers.py:embedding:107
   9.95    415 MB  models/layers.py:__init__:113
   9.95    415 MB  models/layers.py:__init__:98
   9.95    419 MB  models/loader.py:load_target:205
   9.96    420 MB  models/quant.py:read_gguf:445
  10.00    423 MB  models/quant.py:take:378
  10.03    424 MB  models/quant.py:skip:401
  10.05    425 MB  models/quant.py:take:376
  10.11    420 MB  models/quant.py:read_gguf:469
  10.11    660 MB  models/quant.py:read_gguf:477
  10.41    656 MB  models/quant.py:read_gguf:476
  10.43    628 MB  models/quant.py:read_gguf:499
  10.47    693 MB  models/quant.py:dequantize:81
  10.48    697 MB  models/quant.py:as_q8_0:101
  10.53    682 MB  models/quant.py:as_q8_0:102
  10.59    698 MB  models/checkpoint.py:check_checkpoint:27
  10.59    698 MB  models/checkpoint.py:fuse_checkpoint:100
  11.25    714 MB  models/quant.py:__torch_dispatch__:256
  11.27    717 MB  models/llama.py:load_checkpoint:300
  11.28    717 MB  models/layers.py:set_precision:82
  11.29    717 MB  models/quant.py:pack:139
  11.34    717 MB  models/quant.py:pack_owned:151
  11.89    717 MB  models/quant.py:pack_model:290
  12.07    717 MB  models/quant.py:pack_model:297
  12.79    717 MB  runtime.py:trim_heap:60
  12.80    692 MB  engine/llm_engine.py:__init__:50
  12.81    704 MB  models/layers.py:table:198
  12.81    704 MB  models/layers.py:forward:118
  12.81    704 MB  models/layers.py:linear:26
  12.82    704 MB  models/attention.py:_attend:467
  12.91    703 MB  models/attention.py:write:289
  12.97    701 MB  models/layers.py:<lambda>:210
  13.00    701 MB  models/attention.py:forward:460
  13.08    703 MB  models/layers.py:forward:229
  13.13    704 MB  models/layers.py:apply_rope:207
  13.62    700 MB  models/layers.py:apply_rope:206
  13.96    704 MB  models/layers.py:add_forward:124
  14.32    701 MB  models/llama.py:hidden:366
  14.63    702 MB  models/attention.py:forward:438
  14.73    703 MB  models/attention.py:write:288
  14.76    702 MB  models/gemma3.py:forward:29
  14.84    703 MB  models/gemma3.py:forward:31
  15.91    703 MB  engine/sampling.py:greedy:158
  16.02    703 MB  engine/tree.py:accept_paths:197
  16.19    704 MB  engine/model_runner.py:run:162
  16.44    704 MB  models/attention.py:forward:451
