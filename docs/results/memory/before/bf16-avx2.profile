# stage load_target                  done: VmRSS  2839 MB, VmHWM  2839 MB
# stage load_tokenizer               done: VmRSS  2932 MB, VmHWM  2939 MB
# stage ModelRunner.__init__         done: VmRSS  3444 MB, VmHWM  3444 MB
# stage LLMEngine.__init__           done: VmRSS  3444 MB, VmHWM  3444 MB
# stage LLMEngine.generate           done: VmRSS  4135 MB, VmHWM  4135 MB

[none, cpu bfloat16 weights, float32 compute, avx2 kernels] 16 tokens in 3.30s (4.85 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 4135 MB at 9.50 s in models/llama.py:native_stack:399; VmHWM 4135 MB; at the end RssAnon 321 MB, RssFile 174 MB
   0.01    380 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:7
   0.03     14 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.04    227 MB  engine/tree.py:<module>:24
   1.52    228 MB  kernels/__init__.py:<module>:25
   1.52    374 MB  models/attention.py:<module>:18
   3.56    375 MB  models/layers.py:<module>:15
   3.57    375 MB  models/attention.py:<module>:22
   3.58    376 MB  models/loader.py:<module>:22
   3.58    376 MB  models/loader.py:<module>:26
   3.59    376 MB  models/loader.py:<module>:36
   3.60    376 MB  engine/model_runner.py:<module>:22
   3.60    376 MB  engine/model_runner.py:<module>:23
   3.60    376 MB  engine/model_runner.py:<module>:24
   3.61    376 MB  engine/model_runner.py:<module>:26
   3.62    376 MB  engine/sequence.py:<module>:11
   3.62    380 MB  engine/detokenizer.py:<module>:11
   3.63    380 MB  engine/model_runner.py:<module>:30
   3.64    380 MB  models/drafter.py:<module>:32
   3.65    380 MB  engine/llm_engine.py:<module>:26
   3.65    380 MB  engine/llm_engine.py:<module>:32
   3.66    381 MB  bench/attack.py:<module>:26
   3.68    381 MB  bench/attack.py:<module>:29
   3.69    381 MB  bench/serving.py:<module>:27
   3.70    381 MB  bench/serving.py:<module>:28
   3.70    381 MB  prompts.py:<module>:23
   3.71    382 MB  serve/limits.py:<module>:25
   3.75    383 MB  serve/limits.py:<module>:28
   3.76    385 MB  serve/requests.py:<module>:10
   3.78    391 MB  serve/requests.py:<module>:11
   3.87    392 MB  serve/responses.py:<module>:10
   3.87    400 MB  serve/responses.py:<module>:11
   4.11    401 MB  serve/responses.py:<module>:21
   4.12    401 MB  serve/requests.py:<module>:71
   4.14    402 MB  cli.py:build_parser:276
   4.14    401 MB  bench/baseline/runner.py:<module>:16
   4.15    401 MB  bench/baseline/runner.py:<module>:18
   4.15    401 MB  bench/baseline/runner.py:<module>:19
   4.18    402 MB  cli.py:build_parser:283
   4.18    402 MB  cli.py:build_parser:401
   4.19    402 MB  cli.py:_add_train_args:253
   4.19    402 MB  train/trainer.py:<module>:36
   4.19    402 MB  train/data.py:<module>:22
   4.20    402 MB  train/trainer.py:<module>:37
   4.20    402 MB  cli.py:build_parser:417
   4.21    402 MB  cli.py:build_parser:438
   4.21    403 MB  kernels/__init__.py:available:75
   4.22    405 MB  models/layers.py:__init__:98
   4.22   2247 MB  models/layers.py:rope_frequencies:142
   4.22    409 MB  models/checkpoint.py:read_safetensors:48
   4.23    417 MB  models/checkpoint.py:check_checkpoint:26
   4.23   2247 MB  models/checkpoint.py:fuse_checkpoint:73
   5.04   2835 MB  models/layers.py:set_precision:83
   5.36   2839 MB  models/layers.py:set_precision:80
   5.37   2865 MB  models/loader.py:load_tokenizer:219
   7.00   2932 MB  models/loader.py:load_tokenizer:220
   7.83   3426 MB  models/attention.py:__init__:271
   7.84   3442 MB  models/attention.py:__init__:272
   8.20   3444 MB  prompts.py:render:128
   8.20   3445 MB  prompts.py:encode:136
   8.21   4135 MB  models/llama.py:embed:407
   8.21   4135 MB  models/llama.py:native_stack:399   <- peak
   9.30   4132 MB  models/llama.py:<lambda>:318
   9.48   4135 MB  models/layers.py:linear:29
   9.64   4135 MB  models/attention.py:slots:153
   9.76   4135 MB  engine/tree.py:accept_paths:194
  10.04   4135 MB  engine/sampling.py:greedy:157
  10.17   4135 MB  runtime.py:to_device:132
  10.30   4135 MB  models/layers.py:table:194
  10.68   4135 MB  models/llama.py:hidden:365
  10.83   4135 MB  engine/tree.py:accept_paths:196
  11.51   4135 MB  kernels/__init__.py:isa:125
