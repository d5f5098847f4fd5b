// histogram / histogramdd: PyTorch has no meta kernels for them, so they are backend
// kernels around one internal program per signature (the bin arithmetic lives in
// lowering/histogram.cpp, shared with histc). Output shapes come from the bin counts.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <iomanip>
#include <sstream>

#include "backend/device_checks.h"
#include "backend/dtypes.h"
#include "backend/executor.h"
#include "backend/storage.h"
#include "lowering/factory.h"
#include "lowering/histogram.h"

namespace tpu::backend {
namespace {

using ir::Builder;
using ir::Type;
using ir::Value;
namespace hist = lowering::hist;

Type type_of(const at::Tensor& t) {
  return Type{device_dtype(t.scalar_type(), "histogram"), std::vector<int64_t>(t.sizes().begin(), t.sizes().end())};
}

// Bins of each dim: counts (edges from range or data) or given edge tensors.
struct BinSpec {
  std::vector<int64_t> counts;
  std::optional<c10::ArrayRef<double>> range;
  std::vector<at::Tensor> edges;
};

// The histogram of the rows of `self` ([..., D] taken as [M, D]) and its edges.
std::pair<at::Tensor, std::vector<at::Tensor>> run_histogramdd(const at::Tensor& self, const BinSpec& spec,
                                                               const std::optional<at::Tensor>& weight,
                                                               bool density, bool local_search) {
  if (weight.has_value()) check_same_device({self, *weight});
  for (const at::Tensor& e : spec.edges) check_same_device({self, e});
  TORCH_CHECK(self.dim() >= 2, "torch.histogramdd: input tensor should have at least 2 dimensions, but got ",
              self.dim());
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"histogramdd\" not implemented for '",
                              self.scalar_type(), "' (torch.histogram takes floating-point input)");
  int64_t d = self.size(-1), m = d ? self.numel() / d : 0;
  bool given = !spec.edges.empty();
  TORCH_CHECK(int64_t(given ? spec.edges.size() : spec.counts.size()) == d, "torch.histogramdd: expected ", d,
              " sequences of bin edges for a ", d, "-dimensional histogram");
  if (weight) {
    TORCH_CHECK(weight->scalar_type() == self.scalar_type(),
                "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the same dtype");
    TORCH_CHECK(weight->numel() == m, "torch.histogramdd: if weight tensor is provided it should have the same shape "
                "as the input tensor excluding its innermost dimension");
  }
  std::vector<int64_t> counts = spec.counts;
  for (const auto& e : spec.edges) {
    TORCH_CHECK(e.scalar_type() == self.scalar_type(), "torch.histogramdd: input tensor and bins tensors should "
                "have the same dtype");
    TORCH_CHECK(e.dim() == 1 && e.numel() > 0, "torch.histogramdd: bins tensor should have one dimension and at "
                "least 1 element");
    counts.push_back(e.numel() - 1);
  }
  for (int64_t j = 0; j < d; ++j)
    TORCH_CHECK(counts[j] > 0 || given, "torch.histogram(): bins must be > 0, but got ", counts[j], " for dimension ", j);
  if (spec.range) {
    TORCH_CHECK(int64_t(spec.range->size()) == 2 * d, "torch.histogramdd: for a ", d, "-dimensional histogram range "
                "should have ", 2 * d, " elements, but got ", spec.range->size());
    for (int64_t j = 0; j < d; ++j) {
      double l = (*spec.range)[2 * j], r = (*spec.range)[2 * j + 1];
      TORCH_CHECK(std::isfinite(l) && std::isfinite(r), "torch.histogramdd: dimension ", j, "'s range [", l, ", ",
                  r, "] is not finite");
      TORCH_CHECK(l <= r, "torch.histogramdd: min should not exceed max, but got min ", l, " max ", r,
                  " for dimension ", j);
    }
  }
  int dev = device_index(self);
  at::Tensor x2 = self.reshape({m, d});
  Type xt = type_of(x2);
  std::ostringstream key;
  key << std::setprecision(17) << "histogramdd:" << xt.str() << (weight ? "w" : "") << density << local_search << ":";
  for (auto c : counts) key << c << ",";
  if (spec.range)
    for (double v : *spec.range) key << v << ",";
  std::vector<Operand> args{dense_value(x2)};
  std::vector<Type> et;
  for (const auto& e : spec.edges) {
    args.push_back(dense_value(e));
    et.push_back(type_of(e));
    key << et.back().str();
  }
  if (weight) args.push_back(dense_value(weight->reshape({m})));
  bool data_range = !given && !spec.range;
  auto res = run_internal(key.str(), [&](Builder& b) {
    Value x = b.param(xt);
    std::vector<Value> edges;
    for (const auto& t : et) edges.push_back(b.param(t));
    std::optional<Value> w;
    if (weight) w = b.param(Type{xt.dtype, {m}});
    std::vector<Value> out;
    std::optional<Value> ok;
    if (!given) {
      Value left, right;
      if (spec.range) {
        std::vector<double> l, r;
        for (int64_t j = 0; j < d; ++j) {
          double lj = (*spec.range)[2 * j], rj = (*spec.range)[2 * j + 1];
          if (lj == rj) lj -= 0.5, rj += 0.5;
          l.push_back(lj);
          r.push_back(rj);
        }
        auto vec = [&](const std::vector<double>& v) {
          std::vector<Value> parts;
          for (double x : v) parts.push_back(b.constant(x, DType::F64, {1}));
          return b.concatenate(parts, 0);
        };
        left = vec(l);
        right = vec(r);
      } else {
        hist::Outer o = hist::outer_from_data(b, x);
        left = o.left;
        right = o.right;
        ok = o.ok;
      }
      for (int64_t j = 0; j < d; ++j) {
        Value lj = b.reshape(b.slice(left, {j}, {j + 1}, {1}), {});
        Value rj = b.reshape(b.slice(right, {j}, {j + 1}, {1}), {});
        edges.push_back(lowering::linspace_values(b, lj, rj, counts[j] + 1, xt.dtype));
      }
    }
    out.push_back(hist::histogram(b, x, edges, w, density,
                                  given ? hist::Find::Search : local_search ? hist::Find::LinearLocal
                                                                            : hist::Find::Linear));
    for (const auto& e : edges) out.push_back(e);
    if (ok) out.push_back(*ok);
    return out;
  }, args, dev);
  at::Tensor h = wrap_value(res[0], self.scalar_type(), counts, dev);
  std::vector<at::Tensor> edges;
  for (int64_t j = 0; j < d; ++j)
    edges.push_back(given ? spec.edges[j].clone() : wrap_value(res[1 + j], self.scalar_type(), {counts[j] + 1}, dev));
  if (data_range) {
    std::vector<c10::Storage> outputs{h.storage()};
    for (const at::Tensor& e : edges) outputs.push_back(e.storage());
    add_device_check(res.back(), "RuntimeError: torch.histogramdd: the range of the input is not finite", outputs);
  }
  return {h, edges};
}

std::tuple<at::Tensor, at::Tensor> histogram_bin_ct(const at::Tensor& self, int64_t bins,
                                                    std::optional<at::ArrayRef<double>> range,
                                                    const std::optional<at::Tensor>& weight, bool density) {
  return guarded([&] {
    BinSpec s;
    s.counts = {bins};
    s.range = range;
    auto [h, e] = run_histogramdd(self.reshape({-1, 1}), s, weight, density, true);
    return std::make_tuple(h, e[0]);
  });
}

std::tuple<at::Tensor, at::Tensor> histogram_bins_tensor(const at::Tensor& self, const at::Tensor& bins,
                                                         const std::optional<at::Tensor>& weight, bool density) {
  return guarded([&] {
    BinSpec s;
    s.edges = {bins};
    auto [h, e] = run_histogramdd(self.reshape({-1, 1}), s, weight, density, false);
    return std::make_tuple(h, e[0]);
  });
}

// The two halves of histogramdd with bin counts: the edges, or the histogram.
std::pair<at::Tensor, std::vector<at::Tensor>> histogramdd_by_counts(const at::Tensor& self, at::IntArrayRef bins,
                                                                      std::optional<at::ArrayRef<double>> range,
                                                                      const std::optional<at::Tensor>& weight,
                                                                      bool density) {
  BinSpec s;
  s.counts = bins.vec();
  s.range = range;
  return run_histogramdd(self, s, weight, density, true);
}

std::vector<at::Tensor> histogramdd_bin_edges(const at::Tensor& self, at::IntArrayRef bins,
                                              std::optional<at::ArrayRef<double>> range,
                                              const std::optional<at::Tensor>& weight, bool density) {
  return guarded([&] { return histogramdd_by_counts(self, bins, range, weight, density).second; });
}

at::Tensor histogramdd_from_bin_cts(const at::Tensor& self, at::IntArrayRef bins,
                                    std::optional<at::ArrayRef<double>> range,
                                    const std::optional<at::Tensor>& weight, bool density) {
  return guarded([&] { return histogramdd_by_counts(self, bins, range, weight, density).first; });
}

at::Tensor histogramdd_from_bin_tensors(const at::Tensor& self, at::TensorList bins,
                                        const std::optional<at::Tensor>& weight, bool density) {
  return guarded([&] {
    BinSpec s;
    s.edges = bins.vec();
    return run_histogramdd(self, s, weight, density, false).first;
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histogram.bin_ct", histogram_bin_ct);
  m.impl("histogram.bins_tensor", histogram_bins_tensor);
  m.impl("_histogramdd_bin_edges", histogramdd_bin_edges);
  m.impl("_histogramdd_from_bin_cts", histogramdd_from_bin_cts);
  m.impl("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors);
}

}  // namespace tpu::backend
