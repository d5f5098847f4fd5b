// Collective programs (ir/collectives.h) compiled for several devices of one client and
// run on all of them (runtime/multi_device.h): every replica's result against a
// reference computed here in float64 / int64. ctest runs this with TPU_NUM_DEVICES=4,
// which gives the XLA CPU plugin's client 4 devices in this one process.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "ir/collectives.h"
#include "runtime/client.h"
#include "runtime/multi_device.h"

using namespace tpu;
using ir::CollectiveKind;
using ir::CollectiveSpec;
using ir::ReduceKind;
using Values = std::vector<double>;

static int g_failed = 0, g_passed = 0;
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error(std::string("CHECK failed: ") + #cond + \
                                          " at line " + std::to_string(__LINE__)); \
  } while (0)

static void run(const std::string& name, const std::function<void()>& fn) {
  std::cout << std::flush;
  try {
    fn();
    ++g_passed;
    std::cout << "PASS " << name << std::endl;
  } catch (const std::exception& e) {
    ++g_failed;
    std::cout << "FAIL " << name << ": " << e.what() << std::endl;
  }
}

static runtime::Client& C() { return runtime::Client::get(); }

// ---- host values <-> bytes of a dtype (bf16 by rounding to nearest even)

static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static std::vector<uint8_t> encode(DType t, const Values& v) {
  std::vector<uint8_t> out(v.size() * itemsize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = out.data() + i * itemsize(t);
    switch (t) {
      case DType::F32: { float f = static_cast<float>(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::BF16: { uint16_t h = to_bf16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::I32: { int32_t x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::I64: { int64_t x = static_cast<int64_t>(v[i]); std::memcpy(p, &x, 8); break; }
      case DType::Bool: *p = v[i] != 0 ? 1 : 0; break;
      default: throw std::runtime_error("test: no encoding for this dtype");
    }
  }
  return out;
}

static Values decode(DType t, const std::vector<uint8_t>& bytes) {
  Values v(bytes.size() / itemsize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t* p = bytes.data() + i * itemsize(t);
    switch (t) {
      case DType::F32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); v[i] = from_bf16(h); break; }
      case DType::I32: { int32_t x; std::memcpy(&x, p, 4); v[i] = x; break; }
      case DType::I64: { int64_t x; std::memcpy(&x, p, 8); v[i] = static_cast<double>(x); break; }
      case DType::Bool: v[i] = *p ? 1 : 0; break;
      default: throw std::runtime_error("test: no decoding for this dtype");
    }
  }
  return v;
}

static int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Replica r's operand: values every op here computes exactly in any order (products and
// sums of these stay within bf16's 8 significant bits), so results compare with ==.
static Values operand(DType t, int r, int64_t n, bool multiplicative = false) {
  static const double kFloats[] = {0.5, 1.0, 1.5, 2.0, -1.0};
  Values v(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::F32: case DType::BF16: v[i] = kFloats[(r * 3 + i) % 5]; break;
      case DType::I32: v[i] = static_cast<double>((r * 7 + i * 3) % 11 - 5); break;
      case DType::I64:  // past 32 bits, except where a product would overflow
        v[i] = static_cast<double>((r * 7 + i * 3) % 11 - 5) * (multiplicative ? 1.0 : 8589934592.0) +
               (multiplicative ? 0 : r);
        break;
      case DType::Bool: v[i] = (r + i) % 3 == 0 ? 1 : 0; break;
      default: throw std::runtime_error("test: no operand for this dtype");
    }
  }
  return v;
}

// Compiles `s` for devices `ids` (default 0..n-1), runs every replica on `inputs`.
static std::vector<Values> run_collective(const CollectiveSpec& s, const std::vector<Values>& inputs,
                                          std::vector<int64_t> ids = {}) {
  if (ids.empty())
    for (int64_t r = 0; r < s.num_replicas; ++r) ids.push_back(runtime::global_device_id(C(), r));
  std::string text = ir::collective_module(s);
  auto exe = runtime::compile_replicated(C(), text, ids, s.key());
  std::vector<runtime::BufferPtr> keep;
  std::vector<std::vector<runtime::Buffer*>> args(s.num_replicas);
  for (int64_t r = 0; r < s.num_replicas; ++r) {
    auto bytes = encode(s.dtype, inputs[r]);
    keep.push_back(C().from_host(bytes.data(), s.dtype, s.shape, runtime::local_device_of(C(), ids[r])));
    args[r].push_back(keep.back().get());
  }
  auto outs = runtime::execute_replicated(C(), *exe, args);
  std::vector<Values> result;
  for (int64_t r = 0; r < s.num_replicas; ++r) {
    CHECK(outs[r].size() == 1);
    const runtime::Buffer& b = *outs[r][0];
    CHECK(b.dims() == ir::collective_result_shape(s));
    CHECK(b.dtype() == s.dtype);
    std::vector<uint8_t> bytes(b.nbytes());
    C().to_host(b, bytes.data(), bytes.size());
    result.push_back(decode(s.dtype, bytes));
  }
  return result;
}

static std::vector<std::vector<int64_t>> groups_or_all(const CollectiveSpec& s) {
  if (!s.groups.empty()) return s.groups;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < s.num_replicas; ++r) all.push_back(r);
  return {all};
}

static double combine(ReduceKind k, DType t, double a, double b) {
  auto i = [](double x) { return static_cast<int64_t>(x); };
  bool boolean = t == DType::Bool;
  switch (k) {
    case ReduceKind::Sum: case ReduceKind::Avg: return boolean ? double(a || b) : a + b;
    case ReduceKind::Product: return boolean ? double(a && b) : a * b;
    case ReduceKind::Min: return std::min(a, b);
    case ReduceKind::Max: return std::max(a, b);
    case ReduceKind::BitAnd: return static_cast<double>(i(a) & i(b));
    case ReduceKind::BitOr: return static_cast<double>(i(a) | i(b));
    case ReduceKind::BitXor: return static_cast<double>(i(a) ^ i(b));
  }
  return 0;
}

// The reduction over `members` of each element, AVG divided (integers truncating).
static Values reduced(const CollectiveSpec& s, const std::vector<Values>& in,
                      const std::vector<int64_t>& members) {
  Values acc = in[members[0]];
  for (size_t m = 1; m < members.size(); ++m)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(s.reduce, s.dtype, acc[i], in[members[m]][i]);
  if (s.reduce == ReduceKind::Avg)
    for (auto& x : acc) {
      x /= static_cast<double>(members.size());
      if (s.dtype == DType::I32 || s.dtype == DType::I64) x = std::trunc(x);
    }
  return acc;
}

static std::string where(const CollectiveSpec& s, int r) {
  return s.key() + " replica " + std::to_string(r);
}

static void expect_equal(const Values& got, const Values& want, const std::string& what) {
  if (got.size() != want.size())
    throw std::runtime_error(what + ": " + std::to_string(got.size()) + " values, expected " +
                             std::to_string(want.size()));
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]))
      throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                               std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
}

// Splits a row-major [d0, d1] array into `k` pieces along `dim`.
static std::vector<Values> split2d(const Values& v, const std::vector<int64_t>& shape, int64_t dim,
                                   int64_t k) {
  std::vector<Values> pieces(k);
  int64_t rows = shape[0], cols = shape[1];
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      int64_t p = dim == 0 ? i / (rows / k) : j / (cols / k);
      pieces[p].push_back(v[i * cols + j]);
    }
  return pieces;
}

// Concatenates [d0, d1]-shaped pieces (each of `piece` shape) along `dim`.
static Values concat2d(const std::vector<Values>& pieces, const std::vector<int64_t>& piece, int64_t dim) {
  Values out;
  int64_t k = static_cast<int64_t>(pieces.size());
  if (dim == 0) {
    for (auto& p : pieces) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
  for (int64_t i = 0; i < piece[0]; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < piece[1]; ++j) out.push_back(pieces[p][i * piece[1] + j]);
  return out;
}

static std::vector<Values> operands(const CollectiveSpec& s, bool multiplicative = false) {
  std::vector<Values> in;
  for (int r = 0; r < s.num_replicas; ++r) in.push_back(operand(s.dtype, r, numel(s.shape), multiplicative));
  return in;
}

static void check_all_reduce(CollectiveSpec s) {
  s.kind = CollectiveKind::AllReduce;
  auto in = operands(s, s.reduce == ReduceKind::Product);
  auto out = run_collective(s, in);
  for (auto& g : groups_or_all(s)) {
    Values want = reduced(s, in, g);
    for (int64_t r : g) expect_equal(out[r], want, where(s, r));
  }
}

static void check_reduce_scatter(CollectiveSpec s) {
  s.kind = CollectiveKind::ReduceScatter;
  auto in = operands(s);
  auto out = run_collective(s, in);
  for (auto& g : groups_or_all(s)) {
    Values all = reduced(s, in, g);
    auto pieces = split2d(all, s.shape, s.dim, static_cast<int64_t>(g.size()));
    for (size_t m = 0; m < g.size(); ++m) expect_equal(out[g[m]], pieces[m], where(s, g[m]));
  }
}

static void check_all_gather(CollectiveSpec s) {
  s.kind = CollectiveKind::AllGather;
  auto in = operands(s);
  auto out = run_collective(s, in);
  for (auto& g : groups_or_all(s)) {
    std::vector<Values> parts;
    for (int64_t r : g) parts.push_back(in[r]);
    Values want = concat2d(parts, s.shape, s.dim);
    for (int64_t r : g) expect_equal(out[r], want, where(s, r));
  }
}

static void check_all_to_all(CollectiveSpec s) {
  s.kind = CollectiveKind::AllToAll;
  auto in = operands(s);
  auto out = run_collective(s, in);
  for (auto& g : groups_or_all(s)) {
    int64_t k = static_cast<int64_t>(g.size());
    std::vector<int64_t> piece = s.shape;
    piece[s.dim] /= k;
    for (int64_t m = 0; m < k; ++m) {
      std::vector<Values> got;  // piece m of every member, in group order
      for (int64_t r : g) got.push_back(split2d(in[r], s.shape, s.dim, k)[m]);
      expect_equal(out[g[m]], concat2d(got, piece, s.dim), where(s, g[m]));
    }
  }
}

static void check_broadcast(CollectiveSpec s) {
  s.kind = CollectiveKind::Broadcast;
  auto in = operands(s);
  auto out = run_collective(s, in);
  for (auto& g : groups_or_all(s))
    for (int64_t r : g) expect_equal(out[r], in[g[s.root]], where(s, r));
}

static void check_permute(CollectiveSpec s) {
  s.kind = CollectiveKind::Permute;
  auto in = operands(s);
  auto out = run_collective(s, in);
  for (int64_t r = 0; r < s.num_replicas; ++r) {
    Values want(numel(s.shape), 0.0);
    for (auto& [a, b] : s.pairs)
      if (b == r) want = in[a];
    expect_equal(out[r], want, where(s, r));
  }
}

static CollectiveSpec spec(DType t, std::vector<int64_t> shape, int64_t n) {
  CollectiveSpec s;
  s.dtype = t;
  s.shape = std::move(shape);
  s.num_replicas = n;
  return s;
}

template <typename Fn>
static void expect_unsupported(Fn fn, const std::string& fragment) {
  try {
    fn();
  } catch (const ir::UnsupportedCollective& e) {
    if (std::string(e.what()).find(fragment) == std::string::npos)
      throw std::runtime_error(std::string("wrong message: ") + e.what());
    return;
  }
  throw std::runtime_error("no UnsupportedCollective raised (expected '" + fragment + "')");
}

int main() {
  // A hang (a replica that never joins its collective) must fail the test, not stall CI.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(240));
    std::cout << "FAIL collective tests hung for 240 s\n" << std::flush;
    _exit(2);
  }).detach();

  const std::vector<DType> kAll = {DType::F32, DType::BF16, DType::I32, DType::I64, DType::Bool};
  const std::vector<DType> kNumbers = {DType::F32, DType::BF16, DType::I32, DType::I64};
  const std::vector<DType> kIntegers = {DType::I32, DType::I64, DType::Bool};

  run("the client has 4 devices (TPU_NUM_DEVICES=4)", [] { CHECK(C().device_count() >= 4); });

  for (int64_t n : {2, 4}) {
    for (DType t : kNumbers)
      for (ReduceKind k : {ReduceKind::Sum, ReduceKind::Product, ReduceKind::Min, ReduceKind::Max,
                           ReduceKind::Avg})
        run(std::string("all_reduce ") + ir::reduce_name(k) + " " + mlir_name(t) + " x" + std::to_string(n), [=] {
          auto s = spec(t, {2, 3}, n);
          s.reduce = k;
          check_all_reduce(s);
        });
    for (DType t : kIntegers)
      for (ReduceKind k : {ReduceKind::BitAnd, ReduceKind::BitOr, ReduceKind::BitXor, ReduceKind::Sum,
                           ReduceKind::Max, ReduceKind::Min})
        run(std::string("all_reduce ") + ir::reduce_name(k) + " " + mlir_name(t) + " x" + std::to_string(n), [=] {
          auto s = spec(t, {5}, n);
          s.reduce = k;
          check_all_reduce(s);
        });
    for (DType t : kAll)
      for (int64_t dim : {0, 1})
        run(std::string("all_gather dim ") + std::to_string(dim) + " " + mlir_name(t) + " x" + std::to_string(n), [=] {
          auto s = spec(t, {2, 3}, n);
          s.dim = dim;
          check_all_gather(s);
        });
    for (DType t : kNumbers)
      for (int64_t dim : {0, 1})
        for (ReduceKind k : {ReduceKind::Sum, ReduceKind::Max, ReduceKind::Avg})
          run(std::string("reduce_scatter ") + ir::reduce_name(k) + " dim " + std::to_string(dim) + " " +
                  mlir_name(t) + " x" + std::to_string(n), [=] {
            auto s = spec(t, {4, 8}, n);
            s.dim = dim;
            s.reduce = k;
            check_reduce_scatter(s);
          });
    for (DType t : kAll)
      for (int64_t dim : {0, 1})
        run(std::string("all_to_all dim ") + std::to_string(dim) + " " + mlir_name(t) + " x" + std::to_string(n), [=] {
          auto s = spec(t, {4, 8}, n);
          s.dim = dim;
          check_all_to_all(s);
        });
    for (DType t : kAll)
      for (int64_t root = 0; root < n; ++root)
        run(std::string("broadcast root ") + std::to_string(root) + " " + mlir_name(t) + " x" + std::to_string(n), [=] {
          auto s = spec(t, {3, 2}, n);
          s.root = root;
          check_broadcast(s);
        });
  }

  run("broadcast over 3 replicas (not a power of two), every root", [] {
    for (int64_t root = 0; root < 3; ++root) {
      auto s = spec(DType::F32, {7}, 3);
      s.root = root;
      check_broadcast(s);
    }
  });
  run("broadcast of a scalar", [] {
    auto s = spec(DType::I64, {}, 4);
    s.root = 2;
    check_broadcast(s);
  });

  // Subgroups: several groups in one program, each reducing on its own.
  run("all_reduce SUM in groups {0,2} {1,3}", [] {
    auto s = spec(DType::F32, {2, 3}, 4);
    s.groups = {{0, 2}, {1, 3}};
    check_all_reduce(s);
  });
  run("all_reduce AVG int32 in groups {3,0} {1,2}", [] {
    auto s = spec(DType::I32, {6}, 4);
    s.groups = {{3, 0}, {1, 2}};
    s.reduce = ReduceKind::Avg;
    check_all_reduce(s);
  });
  run("all_gather in groups {0,1} {2,3}", [] {
    auto s = spec(DType::BF16, {2, 3}, 4);
    s.groups = {{0, 1}, {2, 3}};
    s.dim = 1;
    check_all_gather(s);
  });
  run("reduce_scatter MIN in groups {1,0} {3,2}", [] {
    auto s = spec(DType::I64, {4, 2}, 4);
    s.groups = {{1, 0}, {3, 2}};
    s.reduce = ReduceKind::Min;
    check_reduce_scatter(s);
  });
  run("all_to_all in groups {0,3} {1,2}", [] {
    auto s = spec(DType::I32, {4, 2}, 4);
    s.groups = {{0, 3}, {1, 2}};
    check_all_to_all(s);
  });
  run("broadcast in groups {0,1} {2,3} from each group's second member", [] {
    auto s = spec(DType::Bool, {5}, 4);
    s.groups = {{0, 1}, {2, 3}};
    s.root = 1;
    check_broadcast(s);
  });

  // collective_permute: a ring, and one send/recv pair (the others receive zeros).
  for (DType t : kAll) {
    run(std::string("collective_permute ring ") + mlir_name(t), [=] {
      auto s = spec(t, {2, 3}, 4);
      s.pairs = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
      check_permute(s);
    });
    run(std::string("collective_permute send 1 -> recv 3 ") + mlir_name(t), [=] {
      auto s = spec(t, {4}, 4);
      s.pairs = {{1, 3}};
      check_permute(s);
    });
  }

  run("without channel handles (cross-replica mode) the same values", [] {
    auto s = spec(DType::F32, {3}, 4);
    s.channel = 0;
    check_all_reduce(s);
    check_all_gather([&] { auto g = s; g.shape = {1, 3}; return g; }());
    s.root = 3;
    check_broadcast(s);
  });

  run("replicas on devices in another order (3, 1, 0, 2)", [] {
    auto s = spec(DType::F32, {2, 2}, 4);
    s.kind = CollectiveKind::AllGather;
    std::vector<int64_t> ids;
    for (int d : {3, 1, 0, 2}) ids.push_back(runtime::global_device_id(C(), d));
    auto in = operands(s);
    auto out = run_collective(s, in, ids);
    Values want = concat2d(in, s.shape, 0);
    for (int r = 0; r < 4; ++r) expect_equal(out[r], want, where(s, r));
  });

  run("one program, 1 replica: all_reduce is the identity, AVG divides by 1", [] {
    auto s = spec(DType::I32, {4}, 1);
    s.reduce = ReduceKind::Avg;
    check_all_reduce(s);
  });

  // Each replica launched on its own, as each process of a multi-process client does.
  run("replicas launched one by one (the multi-process path) meet in the collective", [] {
    auto s = spec(DType::F32, {2, 3}, 4);
    s.reduce = ReduceKind::Sum;
    std::vector<int64_t> ids;
    for (int d = 0; d < 4; ++d) ids.push_back(runtime::global_device_id(C(), d));
    auto exe = runtime::compile_replicated(C(), ir::collective_module(s), ids, s.key());
    auto in = operands(s);
    std::vector<runtime::BufferPtr> args, outs;
    for (int r = 0; r < 4; ++r) {
      auto bytes = encode(s.dtype, in[r]);
      args.push_back(C().from_host(bytes.data(), s.dtype, s.shape, r));
    }
    // One thread per replica, as one process per rank: a launch may block its caller until
    // every replica joined the collective (the XLA CPU plugin's does).
    outs.resize(4);
    std::vector<std::string> errors(4);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        try {
          outs[r] = runtime::execute_replica(C(), *exe, r, {args[r].get()})[0];
          runtime::await_ready(C(), *outs[r]);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    Values want = reduced(s, in, {0, 1, 2, 3});
    for (int r = 0; r < 4; ++r) {
      if (!errors[r].empty()) throw std::runtime_error("replica " + std::to_string(r) + ": " + errors[r]);
      std::vector<uint8_t> bytes(outs[r]->nbytes());
      C().to_host(*outs[r], bytes.data(), bytes.size());
      expect_equal(decode(s.dtype, bytes), want, where(s, r));
    }
  });

  // What the emitter refuses, with messages naming op, shape and dtype.
  run("uneven reduce_scatter / all_to_all are refused", [] {
    auto s = spec(DType::F32, {3, 2}, 2);
    s.kind = CollectiveKind::ReduceScatter;
    expect_unsupported([&] { ir::collective_module(s); }, "reduce_scatter of f32[3, 2] over 2 replicas");
    s.kind = CollectiveKind::AllToAll;
    expect_unsupported([&] { ir::collective_module(s); }, "does not split evenly");
  });
  run("bitwise reductions on floats, MIN on complex and AVG on bool are refused", [] {
    auto s = spec(DType::F32, {2}, 2);
    s.reduce = ReduceKind::BitXor;
    expect_unsupported([&] { ir::collective_module(s); }, "BXOR takes integers and bool only");
    s.dtype = DType::C64;
    s.reduce = ReduceKind::Min;
    expect_unsupported([&] { ir::collective_module(s); }, "does not order complex");
    s.dtype = DType::Bool;
    s.reduce = ReduceKind::Avg;
    expect_unsupported([&] { ir::collective_module(s); }, "AVG does not take bool");
  });
  run("groups that do not partition the replicas are refused", [] {
    auto s = spec(DType::F32, {2}, 4);
    s.groups = {{0, 1}, {1, 2}};
    expect_unsupported([&] { ir::collective_module(s); }, "in two groups");
    s.groups = {{0, 1}, {2}};
    expect_unsupported([&] { ir::collective_module(s); }, "of one size");
    s.groups = {{0, 1}};
    expect_unsupported([&] { ir::collective_module(s); }, "cover every replica");
  });
  run("a permute with two targets for one source is refused", [] {
    auto s = spec(DType::F32, {2}, 4);
    s.kind = CollectiveKind::Permute;
    s.pairs = {{0, 1}, {0, 2}};
    expect_unsupported([&] { ir::collective_module(s); }, "one target");
  });
  run("a device id the client does not have is refused at compile", [] {
    auto s = spec(DType::F32, {2}, 2);
    bool threw = false;
    try {
      runtime::compile_replicated(C(), ir::collective_module(s), {0, 12345}, "bad");
    } catch (const runtime::Error& e) {
      threw = std::string(e.what()).find("12345 is not a device") != std::string::npos;
    }
    CHECK(threw);
  });
  run("cache keys differ by every field", [] {
    auto a = spec(DType::F32, {2}, 2), b = a;
    b.reduce = ReduceKind::Max;
    CHECK(a.key() != b.key());
    b = a;
    b.groups = {{1, 0}};
    CHECK(a.key() != b.key());
    b = a;
    b.shape = {1, 2};
    CHECK(a.key() != b.key());
  });

  std::cout << g_passed << " passed, " << g_failed << " failed\n";
  return g_failed ? 1 : 0;
}
