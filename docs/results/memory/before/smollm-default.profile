# stage load_target                  done: VmRSS   759 MB, VmHWM   759 MB
# stage load_tokenizer               done: VmRSS   733 MB, VmHWM   759 MB
# stage load_drafter_for             done: VmRSS   900 MB, VmHWM  1030 MB
# stage ModelRunner.__init__         done: VmRSS  1227 MB, VmHWM  1227 MB
# stage LLMEngine.__init__           done: VmRSS  1230 MB, VmHWM  1230 MB
# stage LLMEngine.generate           done: VmRSS  1232 MB, VmHWM  1232 MB

[parallel K=auto, cpu GGUF Q4_1/Q8_0 weights, int8 compute, avx512 kernels] 8 tokens in 0.15s (54.91 tok/s), acceptance length 2.00, per-position acceptance [1.00, 0.00, 0.00]

# largest VmRSS under each frame (first seen at, s): peak 1232 MB at 13.29 s in engine/model_runner.py:_read_back:243; VmHWM 1232 MB; at the end RssAnon 865 MB, RssFile 176 MB
   0.01    381 MB  (outside peagle)
   0.02     13 MB  cli.py:<module>:5
   0.02     14 MB  engine/auto_k.py:<module>:30
   0.02     14 MB  engine/auto_k.py:<module>:33
   0.03     14 MB  engine/tree.py:<module>:20
   0.03    227 MB  engine/tree.py:<module>:24
   1.57    228 MB  kernels/__init__.py:<module>:25
   1.57    375 MB  models/attention.py:<module>:18
   3.64    376 MB  models/layers.py:<module>:15
   3.65    376 MB  models/attention.py:<module>:22
   3.66    376 MB  models/loader.py:<module>:22
   3.67    377 MB  models/loader.py:<module>:26
   3.68    377 MB  models/loader.py:<module>:36
   3.68    377 MB  engine/model_runner.py:<module>:22
   3.69    377 MB  engine/expansion.py:<module>:65
   3.69    377 MB  engine/processors.py:<module>:20
   3.70    377 MB  engine/model_runner.py:<module>:27
   3.71    380 MB  engine/detokenizer.py:<module>:11
   3.71    381 MB  engine/model_runner.py:<module>:30
   3.73    381 MB  engine/llm_engine.py:<module>:32
   3.73    381 MB  bench/attack.py:<module>:26
   3.74    382 MB  bench/attack.py:<module>:29
   3.75    382 MB  bench/serving.py:<module>:27
   3.76    382 MB  bench/serving.py:<module>:28
   3.76    382 MB  bench/attack.py:<module>:30
   3.76    383 MB  serve/limits.py:<module>:25
   3.79    383 MB  serve/limits.py:<module>:26
   3.80    385 MB  serve/requests.py:<module>:10
   3.83    391 MB  serve/requests.py:<module>:11
   3.91    391 MB  serve/requests.py:<module>:17
   3.91    400 MB  serve/responses.py:<module>:11
   4.13    401 MB  serve/responses.py:<module>:21
   4.14    401 MB  serve/requests.py:<module>:71
   4.15    401 MB  serve/limits.py:<module>:94
   4.16    401 MB  bench/baseline/runner.py:<module>:16
   4.16    401 MB  bench/baseline/runner.py:<module>:18
   4.16    402 MB  bench/baseline/runner.py:<module>:20
   4.17    402 MB  cli.py:build_parser:276
   4.19    402 MB  cli.py:build_parser:283
   4.20    402 MB  cli.py:_add_train_args:253
   4.20    402 MB  train/trainer.py:<module>:36
   4.21    402 MB  train/data.py:<module>:22
   4.22    402 MB  cli.py:build_parser:417
   4.22    402 MB  cli.py:build_parser:438
   4.22    403 MB  kernels/__init__.py:available:75
   4.23    406 MB  models/layers.py:__init__:98
   4.23    406 MB  models/layers.py:__init__:113
   4.24    703 MB  models/layers.py:rope_frequencies:142
   4.25    410 MB  models/quant.py:read_gguf:339
   4.29    575 MB  models/quant.py:read_gguf:344
   8.72    658 MB  models/quant.py:read_gguf:378
   8.73    900 MB  models/quant.py:blocks_of:67
   8.73    603 MB  models/quant.py:read_gguf:377
   8.76    620 MB  models/quant.py:read_gguf:393
   8.83    660 MB  models/checkpoint.py:split_checkpoint:96
   8.83    700 MB  models/quant.py:__torch_dispatch__:241
   8.87    703 MB  models/llama.py:load_checkpoint:298
   8.89    704 MB  models/loader.py:load_target:212
   8.89    900 MB  models/quant.py:pack:137
   9.08    739 MB  models/quant.py:pack_model:281
   9.26    747 MB  models/quant.py:pack_model:274
   9.56    732 MB  models/loader.py:load_tokenizer:219
  11.11    733 MB  models/loader.py:load_tokenizer:220
  11.86    736 MB  models/layers.py:__init__:99
  11.86    843 MB  models/quant.py:dequantize:209
  11.87   1231 MB  models/quant.py:rows:220
  12.04    851 MB  models/checkpoint.py:fuse_checkpoint:73
  12.04    896 MB  models/drafter.py:<dictcomp>:326
  12.06   1027 MB  models/drafter.py:load_drafter:326
  12.20   1029 MB  models/layers.py:set_precision:83
  12.24    900 MB  models/quant.py:quantize_linears:304
  12.27    900 MB  models/quant.py:quantize_linears:305
  12.37   1221 MB  models/attention.py:__init__:271
  12.38   1227 MB  models/attention.py:__init__:272
  12.62   1232 MB  runtime.py:to_device:132
  12.62   1232 MB  models/llama.py:native_stack:399
  12.63   1232 MB  models/layers.py:linear:26
  12.68   1230 MB  models/layers.py:table:194
  12.73   1230 MB  engine/sampling.py:greedy:157
  12.78   1230 MB  models/layers.py:table:193
  12.92   1230 MB  models/llama.py:hidden:365
  13.19   1230 MB  models/layers.py:forward:224
  13.22   1230 MB  models/attention.py:_attend:452
  13.24   1230 MB  prompts.py:encode:136
  13.29   1232 MB  engine/model_runner.py:_read_back:243   <- peak
  13.34   1232 MB  models/layers.py:forward:118
  13.35   1232 MB  models/drafter.py:to_target_ids:219
  13.39   1232 MB  kernels/__init__.py:isa:125
