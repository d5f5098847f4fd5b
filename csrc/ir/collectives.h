// StableHLO modules of one collective among the replicas of a program: each replica
// (one device, one process on a TPU) runs the same module on its own operand, and the
// collective's replica groups say who talks to whom. Used by the device transport of
// tpu_dist (csrc/distributed/device_collectives.*) and compiled for N devices by
// runtime/multi_device.h. Knows nothing of PyTorch or PJRT.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"

namespace tpu::ir {

enum class CollectiveKind {
  AllReduce,      // every member gets the reduction of the group's operands
  AllGather,      // operands concatenated along `dim`, in group order
  ReduceScatter,  // the reduction, split along `dim`: member i keeps piece i
  AllToAll,       // operand split along `dim` into group-size pieces; piece j goes to member j,
                  // which concatenates what it receives along `dim` in group order
  Permute,        // `pairs` (source replica, target replica): a target gets its source's
                  // operand; replicas no pair targets get zeros (send/recv)
  Broadcast,      // every member gets the operand of its group's member `root`
};

enum class ReduceKind { Sum, Avg, Product, Min, Max, BitAnd, BitOr, BitXor };

const char* collective_name(CollectiveKind k);
const char* reduce_name(ReduceKind r);

// Raised for a collective the emitter does not make (a dtype an op does not take, uneven
// pieces, groups that do not partition the replicas); the message names op, shape, dtype.
class UnsupportedCollective : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::AllReduce;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // each replica's operand
  int64_t num_replicas = 1;
  // Replica ids of each group; every group the same size, together each replica once.
  // Empty: one group of all replicas in order.
  std::vector<std::vector<int64_t>> groups;
  ReduceKind reduce = ReduceKind::Sum;  // AllReduce, ReduceScatter
  int64_t dim = 0;                      // AllGather, ReduceScatter, AllToAll
  std::vector<std::pair<int64_t, int64_t>> pairs;  // Permute
  int64_t root = 0;  // Broadcast: the position (in each group) of the member that sends
  // The channel id of all_reduce / all_gather / reduce_scatter (0: none; with one
  // partition both mean the same groups). all_to_all and collective_permute take none.
  int64_t channel = 1;

  // Everything the module depends on (a cache key).
  std::string key() const;
};

// The result shape of each replica.
std::vector<int64_t> collective_result_shape(const CollectiveSpec& s);
// The module: `main` takes the replica's operand and returns its result. Throws
// UnsupportedCollective.
std::string collective_module(const CollectiveSpec& s);

}  // namespace tpu::ir
