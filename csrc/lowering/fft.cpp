// Discrete Fourier transforms: PyTorch's three primitives (_fft_r2c, _fft_c2r,
// _fft_c2c) on stablehlo.fft, one transformed dim at a time (moved last and back).
// stablehlo's inverse transforms divide by n; PyTorch's `normalization` argument
// (0 none, 1 1/sqrt(n), 2 1/n) is applied on top of undoing that.
#include <cmath>

#include "lowering/helpers.h"

namespace tpu::lowering {

static DType complex_of(DType t) {
  if (t == DType::F32) return DType::C64;
  if (t == DType::F64) return DType::C128;
  throw Unsupported("fft of this dtype");
}
static DType real_of(DType t) { return t == DType::C128 ? DType::F64 : DType::F32; }

// fft of `type` over dim d of x with the given length (the output's size of d
// for IRFFT); d is moved to the end for the op and back after.
static Value fft_dim(Builder& b, const Value& x, int64_t d, const char* type, int64_t length,
                     DType out_t) {
  int64_t r = x.rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  Value t = d == r - 1 ? x : b.transpose(x, perm);
  Shape s = t.shape();
  if (std::string(type) == "IRFFT") s.back() = length;
  Value y = b.raw("stablehlo.fft", {t}, std::string("fft_type = #stablehlo<fft_type ") + type +
                                           ">, fft_length = " + ir::i64_array({length}),
                  Type{out_t, s});
  if (d == r - 1) return y;
  std::vector<int64_t> inv(r);
  for (int64_t i = 0; i < r; ++i) inv[perm[i]] = i;
  return b.transpose(y, inv);
}

// x * k for a real or complex x.
static Value scale(Builder& b, const Value& x, double k) {
  if (k == 1.0) return x;
  if (!is_complex(x.dtype())) return mul(b, x, full_like(b, x, k));
  Type rt{real_of(x.dtype()), x.shape()};
  Value re = b.raw("stablehlo.real", {x}, "", rt), im = b.raw("stablehlo.imag", {x}, "", rt);
  Value kk = b.constant(k, rt.dtype, rt.shape);
  return b.raw("stablehlo.complex", {mul(b, re, kk), mul(b, im, kk)}, "", x.type);
}

// Factor that turns the op's own scaling (none forward, 1/n inverse) into PyTorch's.
static double norm_factor(int64_t mode, double n, bool inverse) {
  double want = mode == 0 ? 1.0 : mode == 1 ? 1.0 / std::sqrt(n) : 1.0 / n;
  return inverse ? want * n : want;
}

static std::vector<int64_t> fft_dims(Ctx& ctx, int idx, int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d : ctx.ints(idx)) dims.push_back(wrap_dim(d, rank));
  if (dims.empty()) throw Unsupported("fft over no dims");
  return dims;
}

// Real input: a full complex transform, the last dim halved when onesided.
TPU_LOWER(fft_r2c, "_fft_r2c") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  DType ct = complex_of(x.dtype());
  auto dims = fft_dims(ctx, 1, x.rank());
  Value y = b.convert(x, ct);
  double n = 1;
  for (int64_t d : dims) {
    y = fft_dim(b, y, d, "FFT", x.shape()[d], ct);
    n *= static_cast<double>(x.shape()[d]);
  }
  if (ctx.flag(3)) {
    Shape start(y.rank(), 0), limit = y.shape(), one(y.rank(), 1);
    limit[dims.back()] = x.shape()[dims.back()] / 2 + 1;
    y = b.slice(y, start, limit, one);
  }
  return {scale(b, y, norm_factor(ctx.i(2), n, false))};
}

TPU_LOWER(fft_c2c, "_fft_c2c") {
  Builder& b = ctx.b;
  Value y = ctx.in(0);
  if (!is_complex(y.dtype())) throw Unsupported("_fft_c2c of a real tensor");
  bool forward = ctx.flag(3);
  double n = 1;
  for (int64_t d : fft_dims(ctx, 1, y.rank())) {
    n *= static_cast<double>(y.shape()[d]);
    y = fft_dim(b, y, d, forward ? "FFT" : "IFFT", y.shape()[d], y.dtype());
  }
  return {scale(b, y, norm_factor(ctx.i(2), n, !forward))};
}

// Onesided complex input to real output: inverse transforms over all but the last
// dim, then the complex-to-real one producing last_dim_size values.
TPU_LOWER(fft_c2r, "_fft_c2r") {
  Builder& b = ctx.b;
  Value y = ctx.in(0);
  if (!is_complex(y.dtype())) throw Unsupported("_fft_c2r of a real tensor");
  auto dims = fft_dims(ctx, 1, y.rank());
  int64_t last = dims.back(), len = ctx.i(3);
  if (y.shape()[last] != len / 2 + 1) throw Unsupported("_fft_c2r input not of size n/2+1");
  double n = static_cast<double>(len);
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    n *= static_cast<double>(y.shape()[dims[i]]);
    y = fft_dim(b, y, dims[i], "IFFT", y.shape()[dims[i]], y.dtype());
  }
  y = fft_dim(b, y, last, "IRFFT", len, real_of(y.dtype()));
  return {scale(b, y, norm_factor(ctx.i(2), n, true))};
}

}  // namespace tpu::lowering
