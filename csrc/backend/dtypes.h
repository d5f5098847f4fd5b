// PyTorch dtypes <-> our element types.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "runtime/dtype.h"

namespace tpu::backend {

inline DType to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return DType::Bool;
    case c10::kChar: return DType::I8;
    case c10::kShort: return DType::I16;
    case c10::kInt: return DType::I32;
    case c10::kLong: return DType::I64;
    case c10::kByte: return DType::U8;
    case c10::kUInt16: return DType::U16;
    case c10::kUInt32: return DType::U32;
    case c10::kUInt64: return DType::U64;
    case c10::kHalf: return DType::F16;
    case c10::kBFloat16: return DType::BF16;
    case c10::kFloat: return DType::F32;
    case c10::kDouble: return DType::F64;
    case c10::kComplexFloat: return DType::C64;
    case c10::kComplexDouble: return DType::C128;
    case c10::kFloat8_e4m3fn: return DType::F8E4M3FN;
    case c10::kFloat8_e5m2: return DType::F8E5M2;
    case c10::kFloat8_e4m3fnuz: return DType::F8E4M3FNUZ;
    case c10::kFloat8_e5m2fnuz: return DType::F8E5M2FNUZ;
    default: return DType::Invalid;
  }
}

inline c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::Bool: return c10::kBool;
    case DType::I8: return c10::kChar;
    case DType::I16: return c10::kShort;
    case DType::I32: return c10::kInt;
    case DType::I64: return c10::kLong;
    case DType::U8: return c10::kByte;
    case DType::U16: return c10::kUInt16;
    case DType::U32: return c10::kUInt32;
    case DType::U64: return c10::kUInt64;
    case DType::F16: return c10::kHalf;
    case DType::BF16: return c10::kBFloat16;
    case DType::F32: return c10::kFloat;
    case DType::F64: return c10::kDouble;
    case DType::C64: return c10::kComplexFloat;
    case DType::C128: return c10::kComplexDouble;
    case DType::F8E4M3FN: return c10::kFloat8_e4m3fn;
    case DType::F8E5M2: return c10::kFloat8_e5m2;
    case DType::F8E4M3FNUZ: return c10::kFloat8_e4m3fnuz;
    case DType::F8E5M2FNUZ: return c10::kFloat8_e5m2fnuz;
    default: return c10::ScalarType::Undefined;
  }
}

// The dtype, or a clear error naming the op and dtype when the device cannot hold it. A
// NotImplementedError, as CUDA's for a dtype its kernel lacks: a TypeError would make
// Python's tensor operators return NotImplemented (`x == y` a plain bool).
inline DType device_dtype(c10::ScalarType t, const char* what) {
  DType d = to_dtype(t);
  TORCH_CHECK_NOT_IMPLEMENTED(d != DType::Invalid, what, ": dtype ", t, " is not supported on tpu");
  return d;
}

}  // namespace tpu::backend
