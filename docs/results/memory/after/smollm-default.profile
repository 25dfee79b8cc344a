# stage load_tokenizer               done: VmRSS   354 MB, VmHWM   405 MB
# stage load_target                  done: VmRSS   460 MB, VmHWM   490 MB
# stage load_drafter_for             done: VmRSS   583 MB, VmHWM   638 MB
# stage ModelRunner.__init__         done: VmRSS   583 MB, VmHWM   638 MB
# stage LLMEngine.__init__           done: VmRSS   600 MB, VmHWM   638 MB
# stage LLMEngine.generate           done: VmRSS   606 MB, VmHWM   638 MB

[parallel K=auto, cpu GGUF Q4_1/Q8_0 weights, int8 compute, avx512 kernels] 8 tokens in 0.17s (47.18 tok/s), acceptance length 2.00, per-position acceptance [1.00, 0.00, 0.00]

# largest VmRSS under each frame (first seen at, s): peak 636 MB at 7.62 s in models/layers.py:set_precision:83; VmHWM 638 MB; at the end RssAnon 354 MB, RssFile 109 MB
   0.01    235 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.03     13 MB  engine/auto_k.py:<module>:29
   0.03     13 MB  engine/auto_k.py:<module>:30
   0.03     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.04    227 MB  engine/tree.py:<module>:24
   1.60    228 MB  kernels/__init__.py:<module>:25
   1.62    230 MB  engine/tree.py:<module>:27
   1.63    230 MB  models/attention.py:<module>:23
   1.64    230 MB  models/loader.py:<module>:22
   1.65    231 MB  models/loader.py:<module>:26
   1.66    231 MB  models/llama.py:<module>:49
   1.66    231 MB  engine/model_runner.py:<module>:22
   1.67    231 MB  engine/expansion.py:<module>:22
   1.67    231 MB  engine/processors.py:<module>:20
   1.68    231 MB  engine/sampling.py:<module>:18
   1.68    234 MB  engine/detokenizer.py:<module>:11
   1.69    235 MB  engine/model_runner.py:<module>:30
   1.71    235 MB  engine/llm_engine.py:<module>:32
   1.71    235 MB  bench/attack.py:<module>:17
   1.72    236 MB  bench/attack.py:<module>:26
   1.74    236 MB  bench/serving.py:<module>:27
   1.74    236 MB  bench/serving.py:<module>:28
   1.75    236 MB  bench/attack.py:<module>:30
   1.75    237 MB  serve/limits.py:<module>:25
   1.94    237 MB  serve/limits.py:<module>:26
   1.95    238 MB  serve/limits.py:<module>:28
   1.95    240 MB  serve/requests.py:<module>:10
   1.98    246 MB  serve/requests.py:<module>:11
   2.06    246 MB  serve/requests.py:<module>:17
   2.07    255 MB  serve/responses.py:<module>:11
   2.30    256 MB  serve/responses.py:<module>:21
   2.31    256 MB  serve/requests.py:<module>:71
   2.32    256 MB  serve/limits.py:<module>:37
   2.32    257 MB  bench/baseline/runner.py:<module>:16
   2.33    257 MB  bench/baseline/runner.py:<module>:18
   2.33    257 MB  bench/baseline/runner.py:<module>:20
   2.34    257 MB  cli.py:build_parser:276
   2.35    257 MB  bench/sweep.py:<module>:23
   2.36    257 MB  cli.py:build_parser:283
   2.37    257 MB  cli.py:_add_train_args:253
   2.37    258 MB  train/trainer.py:<module>:36
   2.38    258 MB  train/data.py:<module>:22
   2.38    258 MB  train/trainer.py:<module>:37
   2.39    258 MB  cli.py:build_parser:417
   2.39    258 MB  cli.py:build_parser:438
   2.40    258 MB  kernels/__init__.py:available:75
   2.40    284 MB  models/loader.py:load_tokenizer:223
   3.87    406 MB  models/loader.py:load_tokenizer:225
   6.02    596 MB  runtime.py:trim_heap:66
   6.04    356 MB  models/layers.py:__init__:98
   6.04    357 MB  models/layers.py:__init__:113
   6.04    359 MB  models/layers.py:rope_frequencies:142
   6.05    362 MB  models/quant.py:read_gguf:445
   6.09    362 MB  models/quant.py:skip:401
   6.10    363 MB  models/quant.py:take:378
   6.12    363 MB  models/quant.py:gguf_tensors:373
   6.14    363 MB  models/quant.py:read_gguf:456
   6.14    459 MB  models/quant.py:read_gguf:477
   6.19    422 MB  models/quant.py:read_gguf:486
   6.22    451 MB  models/quant.py:read_gguf:476
   6.25    460 MB  models/checkpoint.py:check_checkpoint:27
   6.26    460 MB  models/checkpoint.py:fuse_checkpoint:100
   6.26    489 MB  models/quant.py:__torch_dispatch__:256
   6.29    489 MB  models/llama.py:load_checkpoint:300
   6.30    489 MB  models/layers.py:set_precision:82
   6.30    621 MB  models/quant.py:pack:139
   6.51    490 MB  models/quant.py:pack_owned:151
   6.62    490 MB  models/quant.py:pack_model:290
   6.93    490 MB  models/quant.py:pack_model:292
   7.35    621 MB  runtime.py:trim_heap:60
   7.36    460 MB  models/checkpoint.py:read_safetensors:48
   7.36    478 MB  models/checkpoint.py:_read_tensor:76
   7.38    594 MB  models/quant.py:dequantize:224
   7.42    600 MB  models/quant.py:rows:235
   7.57    631 MB  models/drafter.py:<dictcomp>:327
   7.60    636 MB  models/layers.py:set_precision:83   <- peak
   7.63    630 MB  models/quant.py:quantize_linears:334
   8.15    583 MB  models/attention.py:untouched_zeros:272
   8.15    583 MB  models/quant.py:rows:233
   8.15    606 MB  models/llama.py:native_stack:403
   8.17    606 MB  models/layers.py:linear:26
   8.22    606 MB  models/layers.py:table:198
   8.31    598 MB  engine/sampling.py:greedy:157
   8.46    592 MB  models/llama.py:embed:411
   8.63    597 MB  models/layers.py:forward:118
   8.72    597 MB  models/llama.py:hidden:369
   8.80    598 MB  models/attention.py:_attend:467
   8.81    598 MB  models/layers.py:forward:228
   8.83    600 MB  prompts.py:encode:136
   8.90    605 MB  engine/model_runner.py:_read_back:243
   8.96    606 MB  runtime.py:to_device:147
   9.01    606 MB  kernels/__init__.py:isa:125
