// AOT library for CUDA: every CUDA unit of python/opmux/kernels/jit/csrc (<group>_cuda.cu) in one
// shared object. The units are not listed here: the build derives the list from that folder
// (opmux.kernels.jit.modules.write_aot_header("cuda", folder) writes opmux_aot_cuda_units.h).
// Build with -I <that folder> -I python/opmux/kernels/jit/csrc -I python/opmux/kernels/jit/include.
#include "opmux_aot_cuda_units.h"
