"""Decoding pairs alone (bench.py's tg_pair), for a second look at files whose pairs ran low."""
import json, os, statistics, sys
sys.path.insert(0, "benchmarks/real_sizes")
from bench import tg_pair
bench = "/root/.cache/llama-native/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench"
env = {**os.environ, "PEAGLE_TORCH_THREADS": "2", "OMP_NUM_THREADS": "2"}
out = {}
for path in sys.argv[1:]:
    pairs = [tg_pair(bench, path, 2, env, swap=i % 2 == 1) for i in range(3)]
    r = sorted(p / l for l, p in pairs)
    out[os.path.basename(path)] = {"pairs (llama, peagle)": pairs, "ratio_median": statistics.median(r)}
    print(f"{os.path.basename(path)}: pairs {[f'{p:.2f}/{l:.2f}' for l, p in pairs]} median {statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})", flush=True)
print(json.dumps(out))
