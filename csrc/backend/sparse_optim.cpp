// SparseAdam's and Adagrad's steps for a tpu parameter with a sparse COO gradient
// (nn.Embedding / EmbeddingBag with sparse=True), at the gradient's own entry count.
//
// PyTorch's steps first coalesce the gradient: the number of distinct rows is data, so
// on tpu every op after it (gathers, the update math, the writes) was built again for
// each new count, ~15 programs per step, and the count was read back to the host. Here
// nothing is sized by data: every entry of the uncoalesced gradient (its count is fixed by
// the batch's shape) carries the sum of all entries at its position, computed at that
// count. Entries at one position then read the same state, compute the same new row and
// write equal values, so the writes need no order; each row's arithmetic is the ops and
// the order of PyTorch's step (the values equal the coalescing path's).
// torch_tpu/_sparse_optim.py routes tpu parameters here.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>

namespace tpu::backend {
namespace {

// Per entry of `grad`: its position (one index tensor per sparse dim) and the sum of the
// values of all entries at that position, as coalesce sums them (index_add_ of the
// values, in entry order, onto zeros at each position's rank among the distinct ones).
struct SummedEntries {
  c10::List<std::optional<at::Tensor>> index;
  at::Tensor values;
};

SummedEntries summed_entries(const at::Tensor& grad) {
  const int64_t sd = grad.sparse_dim();
  at::Tensor idx = grad._indices(), val = grad._values();
  SummedEntries r;
  for (int64_t d = 0; d < sd; ++d) r.index.push_back(idx.select(0, d));
  if (grad.is_coalesced() || grad._nnz() < 2) {
    r.values = val;
    return r;
  }
  at::Tensor lin = idx.select(0, 0);  // flat position over the sparse dims
  for (int64_t d = 1; d < sd; ++d) lin = lin.mul(grad.size(d)).add(idx.select(0, d));
  auto [sorted, perm] = lin.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const int64_t n = lin.size(0);
  at::Tensor starts = sorted.narrow(0, 1, n - 1).ne(sorted.narrow(0, 0, n - 1));
  at::Tensor rank_sorted = at::cat({at::zeros({1}, lin.options()), starts.cumsum(0, at::kLong)});
  at::Tensor rank = at::empty_like(rank_sorted).scatter_(0, perm, rank_sorted);  // per entry, in entry order
  at::Tensor sums = at::zeros_like(val).index_add_(0, rank, val);
  r.values = sums.index_select(0, rank);
  return r;
}

void check_operands(const char* op, const at::Tensor& param, const at::Tensor& grad,
                    std::initializer_list<const at::Tensor*> state) {
  TORCH_CHECK(grad.is_sparse() && grad.sparse_dim() >= 1, op, ": expected a sparse COO gradient with at least one ",
              "sparse dim, got layout ", grad.layout(), " sizes ", grad.sizes());
  TORCH_CHECK(!param.is_sparse() && param.sizes() == grad.sizes() && param.scalar_type() == grad.scalar_type(), op,
              ": the parameter (", param.sizes(), ", ", param.scalar_type(), ") and its gradient (", grad.sizes(), ", ",
              grad.scalar_type(), ") must have the same size and dtype");
  for (const at::Tensor* s : state)
    TORCH_CHECK(s->sizes() == param.sizes() && s->scalar_type() == param.scalar_type() && !s->is_sparse(), op,
                ": optimizer state of size ", s->sizes(), " and dtype ", s->scalar_type(),
                " does not match its parameter (", param.sizes(), ", ", param.scalar_type(), ")");
}

// torch.optim._functional.sparse_adam's update of one parameter (step_size: lr *
// sqrt(1 - beta2^step) / (1 - beta1^step), from the host's step count).
void sparse_adam_step(at::Tensor param, const at::Tensor& grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                      double beta1, double beta2, double eps, double step_size, bool maximize) {
  check_operands("SparseAdam", param, grad, {&exp_avg, &exp_avg_sq});
  if (grad._values().numel() == 0) return;  // PyTorch skips an empty gradient
  auto [ix, g] = summed_entries(grad);
  if (maximize) g = g.neg();
  at::Tensor old = exp_avg.index(ix);
  at::Tensor avg = g.sub(old).mul_(1 - beta1).add_(old);  // old + (1 - b1) * (g - old)
  at::Tensor old_sq = exp_avg_sq.index(ix);
  at::Tensor avg_sq = g.pow(2).sub_(old_sq).mul_(1 - beta2).add_(old_sq);
  exp_avg.index_put_(ix, avg);
  exp_avg_sq.index_put_(ix, avg_sq);
  at::Tensor denom = avg_sq.sqrt().add_(eps);
  param.index_put_(ix, param.index(ix).add_(avg.div(denom).mul_(-step_size)));
}

// torch.optim.adagrad's sparse-gradient update of one parameter (clr: the decayed lr).
void sparse_adagrad_step(at::Tensor param, const at::Tensor& grad, at::Tensor state_sum, double clr, double eps,
                         bool maximize) {
  check_operands("Adagrad", param, grad, {&state_sum});
  if (grad._nnz() == 0) return;
  auto [ix, g] = summed_entries(grad);
  if (maximize) g = g.neg();
  at::Tensor sum = state_sum.index(ix).add_(g.pow(2));
  state_sum.index_put_(ix, sum);
  at::Tensor std = sum.sqrt().add_(eps);
  param.index_put_(ix, param.index(ix).add_(g.div(std).mul_(-clr)));
}

}  // namespace

void bind_sparse_optim(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("_sparse_adam_step", &sparse_adam_step, py::arg("param"), py::arg("grad"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("step_size"),
        py::arg("maximize"));
  m.def("_sparse_adagrad_step", &sparse_adagrad_step, py::arg("param"), py::arg("grad"), py::arg("state_sum"),
        py::arg("clr"), py::arg("eps"), py::arg("maximize"));
}

}  // namespace tpu::backend
