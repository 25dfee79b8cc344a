"""``python -m peagle.kernels``: build the native kernels for this machine (``make setup`` runs it), then probe
the AMX tiles where the CPU has them. A failed build is reported and leaves the torch fallback in place; it does
not fail the set-up. An entry point, above every layer (the import contract's one exception, pyproject.toml):
the probe packs weights as the models do (:mod:`peagle.models.amx_probe`)."""
import sys

from peagle import kernels
from peagle.models.amx_probe import probe_amx

try:
    path = kernels.build(verbose="-v" in sys.argv)
except Exception as e:  # no compiler, no headers: the models run on torch's matmul instead
    print(f"peagle: could not build the native kernels ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
          "peagle will use torch's matmul", file=sys.stderr)
    sys.exit(0)
kernels.available.cache_clear()
print(f"peagle: native kernels built at {path} ({kernels.isa()})")
amx = probe_amx()  # AMX-INT8 and AMX-BF16 tiles checked and timed where this CPU has them
if amx is not None:
    print(f"peagle: AMX probe: {amx}; the integer path runs {kernels.int_isa()}, the bf16 path {kernels.bf16_isa()}")
