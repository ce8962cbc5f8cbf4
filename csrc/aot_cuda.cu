// AOT library for CUDA: every CUDA unit of python/opmux/kernels/jit/csrc in one shared object.
// Build with -I python/opmux/kernels/jit/csrc -I python/opmux/kernels/jit/include.
#include "layernorm_cuda.cu"
#include "activation_cuda.cu"
#include "quantization_cuda.cu"
#include "moe_cuda.cu"
#include "kvcache_cuda.cu"
#include "rope_cuda.cu"
