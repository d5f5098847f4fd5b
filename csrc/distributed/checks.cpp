#include "distributed/checks.h"

#include <ATen/MemoryOverlap.h>

#include <numeric>
#include <sstream>

#include <c10/util/Exception.h>

namespace tpu::distributed {

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.device() << " " << c10::toString(t.scalar_type()) << t.sizes();
  return s.str();
}

void check_tpu(const char* op, const std::vector<at::Tensor>& ts, const char* which) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    TORCH_CHECK(t.defined(), "distributed.", op, "(): ", which, "tensor ", i, " is undefined");
    TORCH_CHECK_VALUE(t.is_privateuseone(), "distributed.", op, "(): tpu_dist works on tpu tensors, ",
                      which, "tensor ", i, " is ", describe(t),
                      " (use the gloo backend, or init_process_group() with no backend, for cpu)");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, "distributed.", op,
                      "(): tpu_dist needs dense tensors, ", which, "tensor ", i, " is ", t.layout());
  }
}

void check_writable(const char* op, const std::vector<at::Tensor>& ts, const char* which) {
  for (size_t i = 0; i < ts.size(); ++i)
    TORCH_CHECK_VALUE(at::has_internal_overlap(ts[i]) != at::MemOverlap::Yes, "distributed.", op, "(): ",
                      which, "tensor ", i, " is ", describe(ts[i]),
                      " whose elements overlap in memory (a view such as expand()'s): a collective "
                      "cannot write it; pass a .clone()");
}

void check_reduce_op(const char* op, const c10d::ReduceOp& r, const std::vector<at::Tensor>& ts) {
  using R = c10d::ReduceOp;
  TORCH_CHECK_VALUE(r != R::PREMUL_SUM && r != R::UNUSED, "distributed.", op,
                    "(): reduce op ", r == R::PREMUL_SUM ? "PREMUL_SUM" : "UNUSED",
                    " is not supported by tpu_dist (SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR "
                    "for integers)");
  bool bitwise = r == R::BAND || r == R::BOR || r == R::BXOR;
  for (auto& t : ts) {
    if (!bitwise) {
      TORCH_CHECK_TYPE(!(t.is_complex() && (r == R::MIN || r == R::MAX)), "distributed.", op,
                       "(): MIN/MAX are not defined for complex tensors, got ", describe(t));
      // (NCCL's refusal; integer AVG truncates, as NCCL's does.)
      TORCH_CHECK_TYPE(!(r == R::AVG && t.scalar_type() == at::kBool), "distributed.", op,
                       "(): cannot use ReduceOp.AVG with boolean inputs, got ", describe(t));
      continue;
    }
    TORCH_CHECK_TYPE(at::isIntegralType(t.scalar_type(), /*includeBool=*/true), "distributed.",
                     op, "(): bitwise reduce ops (BAND, BOR, BXOR) need integer tensors, got ",
                     describe(t));
  }
}

void check_per_rank(const char* op, const std::vector<at::Tensor>& ts, int size,
                    const char* which) {
  TORCH_CHECK_VALUE(static_cast<int>(ts.size()) == size, "distributed.", op, "(): length of ",
                    which, " tensors list must match world size, got ", ts.size(), " ", which,
                    " tensors and ", size, " processes");
}

void check_same(const char* op, const std::vector<at::Tensor>& ts, const at::Tensor& like,
                const char* which) {
  for (size_t i = 0; i < ts.size(); ++i) {
    TORCH_CHECK_VALUE(ts[i].sizes() == like.sizes() && ts[i].scalar_type() == like.scalar_type(),
                      "distributed.", op, "(): ", which, " tensor ", i, " is ", describe(ts[i]),
                      ", expected the shape and dtype of ", describe(like));
  }
}

void check_pieces(const char* op, const std::vector<at::Tensor>& ts, const at::Tensor& like, int rank,
                  const char* which) {
  for (size_t i = 0; i < ts.size(); ++i) {
    bool own = static_cast<int>(i) == rank;
    TORCH_CHECK_VALUE(ts[i].scalar_type() == like.scalar_type() && (!own || ts[i].sizes() == like.sizes()),
                      "distributed.", op, "(): ", which, " tensor ", i, " is ", describe(ts[i]),
                      own ? ", expected this rank's piece to have the shape and dtype of "
                          : ", expected the dtype of ",
                      describe(like));
  }
}

void check_times(const char* op, const at::Tensor& big, const at::Tensor& small, int size,
                 const char* big_name, const char* small_name) {
  TORCH_CHECK_TYPE(big.scalar_type() == small.scalar_type(), "distributed.", op, "(): ",
                   big_name, " is ", describe(big), " but ", small_name, " is ", describe(small),
                   "; dtypes must match");
  TORCH_CHECK_VALUE(big.numel() == small.numel() * size, "distributed.", op, "(): ", big_name,
                    " ", describe(big), " must hold world size (", size, ") times the ",
                    small_name, " ", describe(small));
}

void check_rank(const char* op, int rank, int size, const char* what, int self) {
  TORCH_CHECK_VALUE(rank >= 0 && rank < size, "distributed.", op, "(): ", what, " rank ", rank,
                    " is out of range for ", size, " processes");
  TORCH_CHECK_VALUE(rank != self, "distributed.", op, "(): ", what, " rank ", rank,
                    " is this process itself");
}

void check_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits,
                  int size, const char* which) {
  if (splits.empty()) {
    TORCH_CHECK_VALUE(t.dim() > 0 && t.size(0) % size == 0, "distributed.", op, "(): ", which,
                      " ", describe(t), " must split evenly over ", size,
                      " processes in dimension 0 when no split sizes are given");
    return;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, "distributed.", op, "(): ", which,
                    " split sizes have ", splits.size(), " entries for ", size, " processes");
  int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  TORCH_CHECK_VALUE(t.dim() > 0 && total == t.size(0), "distributed.", op, "(): ", which,
                    " split sizes add up to ", total, " but the ", which, " is ", describe(t));
}

}  // namespace tpu::distributed
