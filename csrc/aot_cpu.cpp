// AOT library for CPU: every CPU unit of python/opmux/kernels/jit/csrc in one shared object.
// Build with -I python/opmux/kernels/jit/csrc -I python/opmux/kernels/jit/include.
#include "layernorm_cpu.cpp"
#include "activation_cpu.cpp"
#include "quantization_cpu.cpp"
#include "moe_cpu.cpp"
#include "kvcache_cpu.cpp"
#include "rope_cpu.cpp"
