// Element types the runtime and the IR share. Knows nothing of PyTorch.
#pragma once
#include <cstdint>
#include <string>

namespace tpu {

enum class DType : uint8_t {
  Bool, I8, I16, I32, I64, U8, U32, U64, F16, BF16, F32, F64, C64, C128,
  // 8-bit floats (OCP fp8 and the fnuz variants: no -0 or inf, one NaN).
  F8E4M3FN, F8E5M2, F8E4M3FNUZ, F8E5M2FNUZ,
  U16,  // appended: the values above keep their numbers
  Invalid
};

inline int64_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: case DType::I8: case DType::U8: return 1;
    case DType::F8E4M3FN: case DType::F8E5M2: case DType::F8E4M3FNUZ: case DType::F8E5M2FNUZ: return 1;
    case DType::I16: case DType::U16: case DType::F16: case DType::BF16: return 2;
    case DType::I32: case DType::U32: case DType::F32: return 4;
    case DType::I64: case DType::U64: case DType::F64: case DType::C64: return 8;
    case DType::C128: return 16;
    default: return 0;
  }
}

// Element type as StableHLO spells it.
inline const char* mlir_name(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "ui8";
    case DType::U16: return "ui16";
    case DType::U32: return "ui32";
    case DType::U64: return "ui64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::C64: return "complex<f32>";
    case DType::C128: return "complex<f64>";
    case DType::F8E4M3FN: return "f8E4M3FN";
    case DType::F8E5M2: return "f8E5M2";
    case DType::F8E4M3FNUZ: return "f8E4M3FNUZ";
    case DType::F8E5M2FNUZ: return "f8E5M2FNUZ";
    default: return "invalid";
  }
}

inline bool is_fp8(DType t) {
  return t == DType::F8E4M3FN || t == DType::F8E5M2 || t == DType::F8E4M3FNUZ || t == DType::F8E5M2FNUZ;
}
inline bool is_float(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64 || is_fp8(t);
}
inline bool is_complex(DType t) { return t == DType::C64 || t == DType::C128; }
inline bool is_signed_int(DType t) {
  return t == DType::I8 || t == DType::I16 || t == DType::I32 || t == DType::I64;
}
inline bool is_unsigned_int(DType t) {
  return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64;
}
inline bool is_integral(DType t) { return is_signed_int(t) || is_unsigned_int(t); }

}  // namespace tpu
