// Exact-dtype checks for the non-float tensors of the opmux ops (fp8 bytes, int32/int64
// indices, float32 scales). Shared by CPU and CUDA units; throws tvm-ffi ValueError.
#pragma once

#include "opmux/common.h"

namespace opmux {

inline bool is_dtype(const TensorView& t, uint8_t code, uint8_t bits) {
  const DLDataType d = t.dtype();
  return d.lanes == 1 && d.code == code && d.bits == bits;
}

inline void check_dtype(const char* op, const char* name, const TensorView& t, uint8_t code,
                        uint8_t bits, const char* expected) {
  if (!is_dtype(t, code, bits)) {
    const DLDataType d = t.dtype();
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has dtype " << dtype_name(d)
                              << " (code=" << int(d.code) << ", bits=" << int(d.bits)
                              << "), expected " << expected;
  }
}

inline void check_float32(const char* op, const char* name, const TensorView& t) {
  check_dtype(op, name, t, kDLFloat, 32, "float32");
}
inline void check_int32(const char* op, const char* name, const TensorView& t) {
  check_dtype(op, name, t, kDLInt, 32, "int32");
}
inline void check_int64(const char* op, const char* name, const TensorView& t) {
  check_dtype(op, name, t, kDLInt, 64, "int64");
}

// fp8 e4m3fn output, passed either as float8_e4m3fn or as its uint8 byte view.
inline void check_fp8_bytes(const char* op, const char* name, const TensorView& t) {
  if (!is_dtype(t, kDLFloat8_e4m3fn, 8) && !is_dtype(t, kDLUInt, 8)) {
    const DLDataType d = t.dtype();
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has dtype " << dtype_name(d)
                              << " (code=" << int(d.code) << ", bits=" << int(d.bits)
                              << "), expected float8_e4m3fn (or its uint8 view)";
  }
}

// A dense 1-D tensor of `n` elements (stride 1 unless n <= 1).
inline void check_vector(const char* op, const char* name, const TensorView& t, int64_t n,
                         const char* what) {
  check_ndim(op, name, t, 1);
  check_size(op, name, t, 0, n, what);
  check_last_dim_contiguous(op, name, t);
}

}  // namespace opmux
