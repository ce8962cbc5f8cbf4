// AOT library for CPU: every CPU unit of python/opmux/kernels/jit/csrc (<group>_cpu.cpp) in one
// shared object. The units are not listed here: the build derives the list from that folder
// (opmux.kernels.jit.modules.write_aot_header("cpu", folder) writes opmux_aot_cpu_units.h).
// Build with -I <that folder> -I python/opmux/kernels/jit/csrc -I python/opmux/kernels/jit/include.
#include "opmux_aot_cpu_units.h"
