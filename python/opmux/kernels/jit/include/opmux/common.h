// Shared host-side helpers for opmux native units (CPU and CUDA): dtype dispatch,
// argument validation that raises tvm-ffi ValueError, and raw row addressing.
// Plain C++17; no torch and no CUDA headers, so it compiles with g++ and nvcc alike.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace opmux {

using tvm::ffi::TensorView;

enum class DType { kFloat32, kFloat16, kBFloat16 };

inline const char* dtype_name(DLDataType t) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return "float32";
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return "float16";
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return "bfloat16";
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 64) return "float64";
  if (t.lanes == 1 && t.code == kDLInt) return "int";
  if (t.lanes == 1 && t.code == kDLUInt) return "uint";
  if (t.lanes == 1 && t.code == kDLBool) return "bool";
  return "unsupported";
}

inline const char* device_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLROCM: return "rocm";
    case kDLOneAPI: return "xpu";
    default: return "other";
  }
}

// Which of the three supported dtypes `name` (a tensor argument of `op`) has; throws otherwise.
inline DType get_dtype(const char* op, const char* name, const TensorView& t) {
  DLDataType d = t.dtype();
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) return DType::kFloat32;
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) return DType::kFloat16;
  if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) return DType::kBFloat16;
  TVM_FFI_THROW(ValueError) << op << ": " << name << " has dtype " << dtype_name(d)
                            << " (code=" << int(d.code) << ", bits=" << int(d.bits)
                            << ", lanes=" << int(d.lanes)
                            << "); supported dtypes are float32, float16, bfloat16";
  return DType::kFloat32;  // unreachable
}

// All tensors share the dtype of the first one.
inline DType check_same_dtype(const char* op,
                              std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  auto it = ts.begin();
  DType d = get_dtype(op, it->first, *it->second);
  for (++it; it != ts.end(); ++it) {
    DType e = get_dtype(op, it->first, *it->second);
    if (e != d) {
      TVM_FFI_THROW(ValueError) << op << ": all tensors must have the same dtype, but "
                                << ts.begin()->first << " is "
                                << dtype_name(ts.begin()->second->dtype()) << " and "
                                << it->first << " is " << dtype_name(it->second->dtype());
    }
  }
  return d;
}

// All tensors are on `device_type` and on the same device id; returns that id.
inline int32_t check_device(const char* op, int32_t device_type,
                            std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  int32_t id = ts.begin()->second->device().device_id;
  for (const auto& [name, t] : ts) {
    DLDevice dev = t->device();
    if (dev.device_type != device_type) {
      TVM_FFI_THROW(ValueError) << op << ": " << name << " is on device "
                                << device_name(dev.device_type) << ":" << dev.device_id
                                << " (DLPack type " << dev.device_type << "); this kernel needs "
                                << device_name(device_type) << " tensors";
    }
    if (dev.device_id != id) {
      TVM_FFI_THROW(ValueError) << op << ": all tensors must be on the same device, but "
                                << ts.begin()->first << " is on " << device_name(device_type)
                                << ":" << id << " and " << name << " is on "
                                << device_name(device_type) << ":" << dev.device_id;
    }
  }
  return id;
}

inline void check_ndim(const char* op, const char* name, const TensorView& t, int ndim) {
  if (t.ndim() != ndim) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " must be " << ndim
                              << "-D, got a " << t.ndim() << "-D tensor";
  }
}

inline void check_size(const char* op, const char* name, const TensorView& t, int dim,
                       int64_t expected, const char* what) {
  if (t.size(dim) != expected) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << ".shape[" << dim << "] is "
                              << t.size(dim) << ", expected " << expected << " (" << what << ")";
  }
}

// The last dimension must be dense (stride 1). A dimension of size <= 1 is dense whatever
// its stride says, which matches torch's own contiguity rule.
inline void check_last_dim_contiguous(const char* op, const char* name, const TensorView& t) {
  int last = t.ndim() - 1;
  if (t.size(last) > 1 && t.stride(last) != 1) {
    TVM_FFI_THROW(ValueError) << op << ": " << name
                              << " must be contiguous in its last dimension (stride 1), got stride "
                              << t.stride(last) << "; call .contiguous() first";
  }
}

// Row stride in elements for a 2-D tensor. Negative strides are rejected: the kernels
// compute addresses as base + row * stride and we keep the arithmetic non-negative.
inline int64_t row_stride(const char* op, const char* name, const TensorView& t) {
  int64_t s = t.size(0) <= 1 ? 0 : t.stride(0);
  if (s < 0) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative row stride (" << s
                              << "); only non-negative strides are supported";
  }
  return s;
}

// Start of the element data (DLPack allows a byte offset on top of `data`).
template <typename T>
inline T* data_ptr(const TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

inline void check_eps(const char* op, double eps) {
  if (!(eps >= 0.0)) {  // also rejects NaN
    TVM_FFI_THROW(ValueError) << op << ": eps must be a non-negative number, got " << eps;
  }
}

}  // namespace opmux

// Calls `__VA_ARGS__` (a generic lambda body) with `scalar_t` bound to the storage type of
// each dtype. FP32_T / FP16_T / BF16_T are the per-device storage types.
#define OPMUX_DISPATCH_DTYPE(DTYPE, FP32_T, FP16_T, BF16_T, ...)   \
  [&] {                                                            \
    switch (DTYPE) {                                               \
      case ::opmux::DType::kFloat32: {                             \
        using scalar_t = FP32_T;                                   \
        return __VA_ARGS__();                                      \
      }                                                            \
      case ::opmux::DType::kFloat16: {                             \
        using scalar_t = FP16_T;                                   \
        return __VA_ARGS__();                                      \
      }                                                            \
      default: {                                                   \
        using scalar_t = BF16_T;                                   \
        return __VA_ARGS__();                                      \
      }                                                            \
    }                                                              \
  }()
