// Argument checks shared by every transport: errors name the collective
// ("distributed.all_gather(): ..."), the shapes, dtypes and ranks involved, and are
// raised before anything is sent, so the process and its tensors stay usable.
#pragma once
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Types.hpp>

namespace tpu::distributed {

// Every tensor is a dense tpu tensor.
void check_tpu(const char* op, const std::vector<at::Tensor>& ts, const char* which = "");
// `op` may reduce tensors of this dtype (PREMUL_SUM never; bitwise ops on integers only).
// Tensors a collective writes: no element of one may alias another (an expand()ed view),
// refused before anything is sent.
void check_writable(const char* op, const std::vector<at::Tensor>& ts, const char* which = "");
void check_reduce_op(const char* op, const c10d::ReduceOp& r, const std::vector<at::Tensor>& ts);
// A list that must hold one tensor per process.
void check_per_rank(const char* op, const std::vector<at::Tensor>& ts, int size,
                    const char* which);
// Each rank's piece of a list (all_gather's outputs, reduce_scatter's inputs): the dtype of `like` throughout,
// and this rank's own piece its shape; other ranks' pieces may differ in size (as on Gloo
// and NCCL).
void check_pieces(const char* op, const std::vector<at::Tensor>& ts, const at::Tensor& like, int rank,
                  const char* which);
// Every tensor of `ts` has `like`'s shape and dtype.
void check_same(const char* op, const std::vector<at::Tensor>& ts, const at::Tensor& like,
                const char* which);
// `big` holds `size` times `small`'s elements, same dtype (into-tensor forms).
void check_times(const char* op, const at::Tensor& big, const at::Tensor& small, int size,
                 const char* big_name, const char* small_name);
// A peer or root rank: in [0, size), and for point-to-point not this rank.
void check_rank(const char* op, int rank, int size, const char* what, int self = -1);
// all_to_all_single's split sizes add up to dimension 0.
void check_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits,
                  int size, const char* which);
std::string describe(const at::Tensor& t);  // "tpu:0 float32[2, 3]"

}  // namespace tpu::distributed
