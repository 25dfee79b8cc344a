# stage load_target                  done: VmRSS  1566 MB, VmHWM  1566 MB
# stage load_tokenizer               done: VmRSS  1503 MB, VmHWM  1807 MB
# stage ModelRunner.__init__         done: VmRSS  1766 MB, VmHWM  1807 MB
# stage LLMEngine.__init__           done: VmRSS  1766 MB, VmHWM  1807 MB
# stage LLMEngine.generate           done: VmRSS  1770 MB, VmHWM  1807 MB

[none, cpu GGUF Q4_K/Q5_0/Q6_K/Q8_0 weights, int8 compute, avx512 kernels] 128 tokens in 3.78s (33.84 tok/s), acceptance length 1.00, per-position acceptance []

# largest VmRSS under each frame (first seen at, s): peak 1770 MB at 32.15 s in models/layers.py:linear:26; VmHWM 1807 MB; at the end RssAnon 1420 MB, RssFile 176 MB
   0.00    375 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.02     13 MB  engine/auto_k.py:<module>:29
   0.02     13 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.03    228 MB  engine/tree.py:<module>:24
   1.58    228 MB  engine/tree.py:<module>:27
   1.59    374 MB  models/attention.py:<module>:18
   3.77    375 MB  models/layers.py:<module>:15
   3.78    375 MB  models/attention.py:<module>:22
   3.79    376 MB  models/loader.py:<module>:22
   3.80    376 MB  models/loader.py:<module>:36
   3.81    377 MB  engine/model_runner.py:<module>:22
   3.81    377 MB  engine/model_runner.py:<module>:23
   3.81    377 MB  engine/model_runner.py:<module>:24
   3.82    377 MB  engine/model_runner.py:<module>:26
   3.83    377 MB  engine/sequence.py:<module>:11
   3.83    380 MB  engine/detokenizer.py:<module>:11
   3.84    380 MB  engine/model_runner.py:<module>:30
   3.85    381 MB  engine/model_runner.py:<module>:63
   3.85    381 MB  engine/llm_engine.py:<module>:32
   3.86    381 MB  bench/attack.py:<module>:26
   3.87    381 MB  bench/attack.py:<module>:29
   3.88    381 MB  bench/serving.py:<module>:27
   3.89    381 MB  bench/workload.py:<module>:17
   3.89    383 MB  serve/limits.py:<module>:25
   3.92    383 MB  serve/limits.py:<module>:28
   3.93    385 MB  serve/requests.py:<module>:10
   3.96    391 MB  serve/requests.py:<module>:11
   4.03    391 MB  serve/requests.py:<module>:17
   4.03    400 MB  serve/responses.py:<module>:11
   4.25    401 MB  serve/responses.py:<module>:21
   4.27    401 MB  serve/requests.py:<module>:71
   4.27    402 MB  cli.py:build_parser:276
   4.28    401 MB  bench/baseline/runner.py:<module>:16
   4.28    401 MB  bench/baseline/runner.py:<module>:18
   4.29    402 MB  bench/baseline/runner.py:<module>:20
   4.31    402 MB  bench/sweep.py:<module>:23
   4.31    402 MB  cli.py:build_parser:313
   4.32    402 MB  train/objective.py:<module>:42
   4.33    402 MB  train/trainer.py:<module>:36
   4.33    402 MB  train/trainer.py:<module>:37
   4.34    402 MB  cli.py:build_parser:417
   4.34    402 MB  cli.py:build_parser:438
   4.35    403 MB  kernels/__init__.py:available:75
   4.35    405 MB  models/layers.py:__init__:113
   4.36    406 MB  models/layers.py:__init__:98
   4.36    408 MB  models/layers.py:rope_frequencies:142
   4.37    410 MB  models/quant.py:read_gguf:339
   4.41   1113 MB  models/quant.py:read_gguf:344
  23.15   1294 MB  models/quant.py:read_gguf:378
  23.21   1437 MB  models/quant.py:blocks_of:67
  23.77   1328 MB  models/quant.py:dequantize:79
  23.77   1325 MB  models/quant.py:as_q8_0:99
  23.79   1308 MB  models/quant.py:unify_fused:120
  23.87   1324 MB  models/quant.py:as_q8_0:98
  23.89   1328 MB  models/checkpoint.py:check_checkpoint:26
  23.89   1357 MB  models/quant.py:__torch_dispatch__:241
  23.92   1359 MB  models/llama.py:load_checkpoint:298
  23.93   1566 MB  models/quant.py:pack:137
  24.64   1538 MB  models/quant.py:pack_model:281
  24.76   1542 MB  models/quant.py:pack_model:274
  25.04   1566 MB  models/quant.py:pack_model:276
  25.25   1394 MB  models/loader.py:load_tokenizer:219
  26.47   1565 MB  models/loader.py:load_tokenizer:220
  31.93   1766 MB  models/attention.py:__init__:272
  31.95   1754 MB  models/attention.py:__init__:271
  32.12   1767 MB  models/quant.py:rows:220
  32.12   1770 MB  models/layers.py:linear:26   <- peak
  32.13   1770 MB  models/attention.py:_attend:452
  32.15   1770 MB  models/layers.py:table:194
  32.42   1770 MB  models/llama.py:hidden:362
  32.60   1770 MB  runtime.py:to_device:132
  32.65   1770 MB  models/attention.py:write:276
  32.72   1770 MB  models/layers.py:forward:118
  32.78   1770 MB  models/gemma3.py:forward:31
  32.92   1770 MB  models/layers.py:apply_rope:203
  33.01   1770 MB  engine/tree.py:accept_paths:196
  33.10   1770 MB  models/layers.py:add_forward:124
  33.14   1770 MB  models/layers.py:apply_rope:202
  33.57   1770 MB  models/attention.py:slots:153
  33.71   1770 MB  engine/tree.py:accept_paths:193
  33.84   1770 MB  models/layers.py:forward:225
  33.89   1770 MB  engine/tree.py:accept_paths:197
  34.21   1770 MB  models/layers.py:table:192
  34.33   1770 MB  models/gemma3.py:embed:47
  34.86   1770 MB  models/gemma3.py:embed:46
  35.45   1770 MB  models/quant.py:rows:218
  35.48   1770 MB  models/attention.py:forward:436
