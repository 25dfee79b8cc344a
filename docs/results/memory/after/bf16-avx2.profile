# stage load_tokenizer               done: VmRSS   355 MB, VmHWM   405 MB
# stage load_target                  done: VmRSS  2166 MB, VmHWM  2403 MB
# stage ModelRunner.__init__         done: VmRSS  2166 MB, VmHWM  2403 MB
# stage LLMEngine.__init__           done: VmRSS  2166 MB, VmHWM  2403 MB
# stage LLMEngine.generate           done: VmRSS  2388 MB, VmHWM  2403 MB

[none, cpu bfloat16 weights, float32 compute, avx2 kernels] 16 tokens in 2.28s (7.03 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 2400 MB at 8.36 s in models/layers.py:set_precision:83; VmHWM 2403 MB; at the end RssAnon 476 MB, RssFile 106 MB
   0.00    230 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.02     13 MB  engine/auto_k.py:<module>:29
   0.02     13 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.03    227 MB  engine/tree.py:<module>:24
   1.58    228 MB  engine/tree.py:<module>:26
   1.59    230 MB  engine/tree.py:<module>:27
   1.61    230 MB  models/attention.py:<module>:23
   1.62    230 MB  models/loader.py:<module>:22
   1.63    231 MB  models/loader.py:<module>:26
   1.63    231 MB  models/llama.py:<module>:49
   1.64    231 MB  engine/model_runner.py:<module>:22
   1.64    231 MB  engine/expansion.py:<module>:22
   1.65    231 MB  engine/model_runner.py:<module>:26
   1.66    231 MB  engine/model_runner.py:<module>:27
   1.66    234 MB  engine/detokenizer.py:<module>:11
   1.67    235 MB  engine/model_runner.py:<module>:30
   1.68    235 MB  engine/model_runner.py:<module>:63
   1.68    235 MB  engine/llm_engine.py:<module>:32
   1.69    235 MB  bench/attack.py:<module>:17
   1.70    235 MB  bench/attack.py:<module>:19
   1.70    236 MB  bench/attack.py:<module>:26
   1.71    236 MB  bench/serving.py:<module>:27
   1.72    236 MB  bench/serving.py:<module>:28
   1.72    236 MB  bench/attack.py:<module>:30
   1.73    237 MB  serve/limits.py:<module>:25
   1.92    237 MB  serve/limits.py:<module>:26
   1.93    240 MB  serve/requests.py:<module>:10
   1.96    246 MB  serve/requests.py:<module>:11
   2.04    246 MB  serve/requests.py:<module>:17
   2.05    255 MB  serve/responses.py:<module>:11
   2.27    256 MB  serve/responses.py:<module>:21
   2.28    256 MB  serve/requests.py:<module>:71
   2.28    257 MB  cli.py:build_parser:276
   2.29    257 MB  bench/baseline/runner.py:<module>:16
   2.30    257 MB  bench/baseline/runner.py:<module>:18
   2.30    257 MB  bench/baseline/runner.py:<module>:20
   2.32    257 MB  cli.py:build_parser:283
   2.34    257 MB  cli.py:_add_train_args:253
   2.34    258 MB  train/trainer.py:<module>:36
   2.35    258 MB  train/trainer.py:<module>:37
   2.35    258 MB  cli.py:build_parser:417
   2.36    258 MB  cli.py:build_parser:438
   2.37    258 MB  kernels/__init__.py:available:75
   2.37    284 MB  models/loader.py:load_tokenizer:223
   3.82    399 MB  models/loader.py:load_tokenizer:225
   5.86   2207 MB  runtime.py:trim_heap:60
   5.87   2177 MB  runtime.py:trim_heap:66
   5.87    357 MB  models/layers.py:__init__:98
   5.89   1964 MB  models/checkpoint.py:_read_tensor:76
   6.57   1175 MB  models/checkpoint.py:_read_tensor:71
   7.25   1968 MB  models/checkpoint.py:check_checkpoint:27
   7.25   2052 MB  models/checkpoint.py:fuse_checkpoint:100
   8.06   2010 MB  models/llama.py:load_checkpoint:300
   8.06   2400 MB  models/layers.py:set_precision:83   <- peak
   8.36   2388 MB  models/layers.py:set_precision:80
   8.74   2166 MB  models/attention.py:untouched_zeros:272
   8.75   2166 MB  prompts.py:render:128
   8.75   2166 MB  prompts.py:encode:136
   8.75   2168 MB  models/llama.py:embed:411
   8.76   2388 MB  models/llama.py:native_stack:403
   9.78   2384 MB  models/llama.py:<lambda>:322
   9.97   2388 MB  models/layers.py:linear:29
   9.98   2386 MB  engine/tree.py:accept_paths:197
  10.10   2386 MB  engine/tree.py:accept_paths:196
  10.23   2387 MB  runtime.py:to_device:147
  10.48   2387 MB  engine/tree.py:accept_paths:200
  11.02   2388 MB  models/layers.py:forward:118
  11.03   2388 MB  kernels/__init__.py:isa:125
