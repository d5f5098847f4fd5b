// Unit tests of the runtime (against the real PJRT plugin) and the StableHLO emitter.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "ir/external.h"
#include "ir/fusion.h"
#include "ir/contraction_size.h"
#include "ir/remat.h"
#include "ir/views.h"
#include "runtime/client.h"

using namespace tpu;
using ir::Builder;
using ir::Type;
using ir::Value;

static int g_failed = 0, g_passed = 0;
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error(std::string("CHECK failed: ") + #cond + \
                                          " at line " + std::to_string(__LINE__)); \
  } while (0)

static void run(const char* name, const std::function<void()>& fn) {
  try {
    fn();
    ++g_passed;
    std::cout << "PASS " << name << "\n";
  } catch (const std::exception& e) {
    ++g_failed;
    std::cout << "FAIL " << name << ": " << e.what() << "\n";
  }
}

static runtime::Client& C() { return runtime::Client::get(); }

template <typename T>
static std::vector<T> fetch(const runtime::Buffer& b) {
  std::vector<T> out(b.numel());
  C().to_host(b, out.data(), out.size() * sizeof(T));
  return out;
}

static std::vector<runtime::BufferPtr> run_program(const std::string& text,
                                                   const std::vector<runtime::BufferPtr>& args) {
  auto exe = C().compile(text, "test");
  std::vector<runtime::Buffer*> raw;
  for (auto& a : args) raw.push_back(a.get());
  return C().execute(*exe, raw, 0, true);
}

int main() {
  run("client has devices and a known API version", [] {
    CHECK(C().device_count() >= 1);
    CHECK(C().api_version().first == PJRT_API_MAJOR);
    CHECK(!C().platform().empty());
  });

  // What tpu_dist's transport choice reads: a client spanning processes would see more
  // devices than it can address. The XLA CPU plugin's never does.
  run("the client sees only its own process's devices", [] {
    CHECK(C().global_device_count() == C().device_count());
  });

  run("host round trip keeps f32, i64, bool and bf16 bits", [] {
    std::vector<float> f = {1.5f, -2.f, 3.25f, 0.f, 1e-30f, 7.f};
    auto b = C().from_host(f.data(), DType::F32, {2, 3}, 0);
    CHECK(b->dims() == std::vector<int64_t>({2, 3}));
    CHECK(fetch<float>(*b) == f);
    std::vector<int64_t> i = {1, -(int64_t(1) << 40), 3};
    CHECK(fetch<int64_t>(*C().from_host(i.data(), DType::I64, {3}, 0)) == i);
    std::vector<uint8_t> p = {1, 0, 1};
    CHECK(fetch<uint8_t>(*C().from_host(p.data(), DType::Bool, {3}, 0)) == p);
    std::vector<uint16_t> h = {0x3f80, 0xc000};
    CHECK(fetch<uint16_t>(*C().from_host(h.data(), DType::BF16, {2}, 0)) == h);
  });

  run("to_host_all copies each buffer into its own destination", [] {
    std::vector<float> f = {1.5f, -2.f, 3.25f};
    std::vector<uint8_t> p = {1, 0, 1, 1};
    std::vector<int64_t> i = {-(int64_t(1) << 40)};
    auto bf = C().from_host(f.data(), DType::F32, {3}, 0);
    auto bp = C().from_host(p.data(), DType::Bool, {4}, 0);
    auto bi = C().from_host(i.data(), DType::I64, {}, 0);
    std::vector<float> of(3);
    std::vector<uint8_t> op(4, 7);
    int64_t oi = 0;
    int64_t transfers = C().counters().d2h_transfers.load();
    C().to_host_all({{bf.get(), of.data(), 12}, {bp.get(), op.data(), 4}, {bi.get(), &oi, 8}});
    CHECK(of == f && op == p && oi == i[0]);
    CHECK(C().counters().d2h_transfers.load() == transfers + 3);
    C().to_host_all({});  // nothing to copy
  });

  run("fp8 buffers keep their bytes and convert to f32", [] {
    // e4m3fn 0x38 = 1, 0xC4 = -3, 0x7E = 448; e5m2 0x3C = 1, 0xC2 = -3, 0x7B = 57344.
    std::vector<uint8_t> e4 = {0x38, 0xC4, 0x7E}, e5 = {0x3C, 0xC2, 0x7B};
    auto b4 = C().from_host(e4.data(), DType::F8E4M3FN, {3}, 0);
    auto b5 = C().from_host(e5.data(), DType::F8E5M2, {3}, 0);
    CHECK(fetch<uint8_t>(*b4) == e4);
    CHECK(std::string(mlir_name(DType::F8E4M3FNUZ)) == "f8E4M3FNUZ" && itemsize(DType::F8E5M2FNUZ) == 1);
    Builder b;
    Value x = b.param(Type{DType::F8E4M3FN, {3}});
    Value y = b.param(Type{DType::F8E5M2, {3}});
    auto out = run_program(b.finish({b.convert(x, DType::F32), b.convert(y, DType::F32)}), {b4, b5});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({1, -3, 448}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({1, -3, 57344}));
  });

  run("live bytes follow buffer lifetimes", [] {
    int64_t before = C().stats(0).live_bytes.load();
    {
      std::vector<float> f(1000, 1.f);
      auto b = C().from_host(f.data(), DType::F32, {1000}, 0);
      CHECK(C().stats(0).live_bytes.load() == before + 4000);
    }
    CHECK(C().stats(0).live_bytes.load() == before);
  });

  run("elementwise program: add and multiply by a constant", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {4}});
    Value y = b.param(Type{DType::F32, {4}});
    Value s = b.binary("stablehlo.add", x, y);
    Value r = b.binary("stablehlo.multiply", s, b.constant(0.5, DType::F32, {4}));
    std::vector<float> a = {1, 2, 3, 4}, c = {10, 20, 30, 40};
    auto out = run_program(b.finish({r}), {C().from_host(a.data(), DType::F32, {4}, 0),
                                           C().from_host(c.data(), DType::F32, {4}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({5.5f, 11.f, 16.5f, 22.f}));
  });

  run("reduce, dot_general and multiple results", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {2, 3}});
    Value sum = b.reduce(x, b.constant(0, DType::F32), {1}, "stablehlo.add");
    Value xt = b.transpose(x, {1, 0});
    Value mm = b.dot_general(x, xt, {}, {}, {1}, {0}, DType::F32);
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    auto out = run_program(b.finish({sum, mm}), {C().from_host(a.data(), DType::F32, {2, 3}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({6, 15}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({14, 32, 32, 77}));
  });

  run("f32 contractions name their precision; narrower ones and fixed ones do not read it", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {2, 3}}), y = b.param(Type{DType::F32, {3, 2}});
    Value h = b.param(Type{DType::BF16, {2, 3}}), k = b.param(Type{DType::BF16, {3, 2}});
    CHECK(!b.reads_matmul_precision());
    b.dot_general(h, k, {}, {}, {1}, {0}, DType::F32);
    CHECK(!b.reads_matmul_precision());
    b.dot_general(x, y, {}, {}, {1}, {0}, DType::F32, ir::DotPrecision::Highest);
    CHECK(!b.reads_matmul_precision());
    b.set_matmul_precision(ir::DotPrecision::High);
    Value d = b.dot_general(x, y, {}, {}, {1}, {0}, DType::F32);
    CHECK(b.reads_matmul_precision());
    std::string text = b.finish({d});
    CHECK(text.find("precision_config = [#stablehlo<precision HIGH>, #stablehlo<precision HIGH>]") != std::string::npos);
    CHECK(text.find("#stablehlo<precision HIGHEST>") != std::string::npos);  // the fixed one
    CHECK(ir::largest_contraction_macs(text) == 2 * 2 * 3);
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    auto out = run_program(text, {C().from_host(a.data(), DType::F32, {2, 3}, 0), C().from_host(a.data(), DType::F32, {3, 2}, 0),
                                  C().from_host(std::vector<uint16_t>(6, 0x3f80).data(), DType::BF16, {2, 3}, 0),
                                  C().from_host(std::vector<uint16_t>(6, 0x3f80).data(), DType::BF16, {3, 2}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({22, 28, 49, 64}));
  });

  run("stable sort with a comparator region carries indices", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {5}});
    Value idx = b.iota(Type{DType::I32, {5}}, 0);
    auto r = b.sort({x, idx}, 0, true, [](Builder& bb, const std::vector<Value>& a) {
      return std::vector<Value>{bb.compare(a[0], a[1], ir::Cmp::LT)};
    });
    std::vector<float> a = {3, 1, 2, 1, 0};
    auto out = run_program(b.finish({r[0], r[1]}), {C().from_host(a.data(), DType::F32, {5}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({0, 1, 1, 2, 3}));
    CHECK(fetch<int32_t>(*out[1]) == std::vector<int32_t>({4, 1, 3, 2, 0}));
  });

  run("while_loop carries state until its condition fails", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {3}});
    // Double x five times: state (i, x).
    auto r = b.while_loop(
        {b.constant(0, DType::I32), x},
        [](Builder& bb, const std::vector<Value>& s) {
          return std::vector<Value>{bb.compare(s[0], bb.constant(5, DType::I32), ir::Cmp::LT)};
        },
        [](Builder& bb, const std::vector<Value>& s) {
          return std::vector<Value>{bb.binary("stablehlo.add", s[0], bb.constant(1, DType::I32)),
                                    bb.binary("stablehlo.add", s[1], s[1])};
        });
    std::vector<float> a = {1, -2, 0.5f};
    auto out = run_program(b.finish({r[0], r[1]}), {C().from_host(a.data(), DType::F32, {3}, 0)});
    CHECK(fetch<int32_t>(*out[0]) == std::vector<int32_t>({5}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({32, -64, 16}));
  });

  run("complex constants: a real value with zero imaginary part", [] {
    Builder b;
    Value c = b.constant(2.5, DType::C64, {2});
    Value re = b.raw("stablehlo.real", {c}, "", Type{DType::F32, {2}});
    Value im = b.raw("stablehlo.imag", {c}, "", Type{DType::F32, {2}});
    auto out = run_program(b.finish({re, im}), {});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({2.5f, 2.5f}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({0, 0}));
  });

  run("views: strided read and scatter write into a storage", [] {
    Builder b;
    Value s = b.param(Type{DType::F32, {3, 4}});
    ir::Geometry col{{3}, {4}, 1};         // column 1
    ir::Geometry tr{{4, 3}, {1, 4}, 0};    // transpose
    Value c = ir::read_view(b, s, col);
    Value t = ir::read_view(b, s, tr);
    Value w = ir::write_view(b, &s, s.type, col, b.constant(-1, DType::F32, {3}));
    std::vector<float> a = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    auto out = run_program(b.finish({c, t, w}), {C().from_host(a.data(), DType::F32, {3, 4}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({1, 5, 9}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
    CHECK(fetch<float>(*out[2]) == std::vector<float>({0, -1, 2, 3, 4, -1, 6, 7, 8, -1, 10, 11}));
  });

  run("views: a slice of rows that ends inside the storage reads and writes without padding", [] {
    Builder b;
    Value s = b.param(Type{DType::F32, {2, 6}});
    ir::Geometry k{{2, 2}, {6, 1}, 2};  // columns 2..3 of each row: the `k` of a qkv split
    Value r = ir::read_view(b, s, k);
    Value w = ir::write_view(b, &s, s.type, k, b.constant(-1, DType::F32, {2, 2}));
    std::string text = b.finish({r, w});
    CHECK(text.find("stablehlo.pad") == std::string::npos);
    std::vector<float> a = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    auto out = run_program(text, {C().from_host(a.data(), DType::F32, {2, 6}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({2, 3, 8, 9}));
    CHECK(fetch<float>(*out[1]) == std::vector<float>({0, 1, -1, -1, 4, 5, 6, 7, -1, -1, 10, 11}));
  });

  run("after: the value bit for bit (signed zeros, NaN, integers, bools), kept apart from x", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {4}});
    Value dep = b.param(Type{DType::F32, {2}});
    Value i = b.param(Type{DType::I32, {2}});
    Value y = b.after(x, dep);
    Value j = b.after(i, dep);
    Value t = b.after(b.compare(i, b.constant(0, DType::I32, {2}), ir::Cmp::GT), i);
    y = b.after(y, b.constant(1, DType::F32));  // a scalar dependence too
    std::vector<float> xs = {-0.0f, 1.5f, NAN, -INFINITY}, ds = {NAN, 2};
    std::vector<int32_t> is = {-7, 3};
    auto out = run_program(b.finish({y, j, t}), {C().from_host(xs.data(), DType::F32, {4}, 0),
                                                 C().from_host(ds.data(), DType::F32, {2}, 0),
                                                 C().from_host(is.data(), DType::I32, {2}, 0)});
    std::vector<float> got = fetch<float>(*out[0]);
    CHECK(std::memcmp(got.data(), xs.data(), sizeof(float) * 4) == 0);
    CHECK(fetch<int32_t>(*out[1]) == is);
    CHECK(fetch<uint8_t>(*out[2]) == std::vector<uint8_t>({0, 1}));
  });

  run("contraction size: multiply-adds of the largest dot or convolution, -1 for text we do not emit", [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {3, 4, 5}});
    Value y = b.param(Type{DType::F32, {3, 5, 6}});
    Value d = b.dot_general(x, y, {0}, {0}, {2}, {1}, DType::F32);  // 3*4*6 outputs, 5 each
    Value img = b.param(Type{DType::F32, {2, 3, 8, 8}});
    Value w = b.param(Type{DType::F32, {4, 3, 3, 3}});
    Value c = b.raw("stablehlo.convolution", {img, w},
                    "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->"
                    "[b, f, 0, 1]>, feature_group_count = 1 : i64, window_strides = array<i64: 1, 1>",
                    Type{DType::F32, {2, 4, 6, 6}});  // 288 outputs, 27 each
    std::string text = b.finish({d, c});
    CHECK(ir::largest_contraction_macs(text) == 2 * 4 * 6 * 6 * 27);
    Builder only_dot;
    Value p = only_dot.param(Type{DType::F32, {3, 4, 5}}), q = only_dot.param(Type{DType::F32, {3, 5, 6}});
    std::string dot_text = only_dot.finish({only_dot.dot_general(p, q, {0}, {0}, {2}, {1}, DType::F32)});
    CHECK(ir::largest_contraction_macs(dot_text) == 3 * 4 * 6 * 5);
    Builder none;
    Value e = none.param(Type{DType::F32, {4}});
    CHECK(ir::largest_contraction_macs(none.finish({none.binary("stablehlo.add", e, e)})) == 0);
    CHECK(ir::largest_contraction_macs("%0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]") == -1);
    // A small program compiled with one-threaded contractions computes the same.
    runtime::ProgramTraits small;
    small.largest_contraction_macs = 120;
    runtime::ProgramTraits large, unknown;
    large.largest_contraction_macs = int64_t{1} << 40;
    CHECK(C().compile_options_for(runtime::CompileEffort::Full, large) ==
          C().compile_options_for(runtime::CompileEffort::Full, unknown));
    if (C().platform() == "cpu")  // one-threaded contractions: the XLA CPU plugin's option
      CHECK(C().compile_options_for(runtime::CompileEffort::Full, small) !=
            C().compile_options_for(runtime::CompileEffort::Full, large));
    // A fused graph keeps threaded contractions however small (else XLA:CPU compiles each
    // small dot as its own LLVM kernel); a one-op program of the same size does not.
    runtime::ProgramTraits small_graph = small;
    small_graph.fused_graph = true;
    CHECK(C().compile_options_for(runtime::CompileEffort::Full, small_graph) ==
          C().compile_options_for(runtime::CompileEffort::Full, large));
    if (C().platform() == "cpu")
      CHECK(C().compile_options_for(runtime::CompileEffort::Fast, small) !=
            C().compile_options_for(runtime::CompileEffort::Fast, large));
    // A portable executable (more than one device) differs only by that field: 2 bytes.
    CHECK(runtime::portable_compile_options(runtime::CompileEffort::Full, {}, false).size() + 2 ==
          runtime::portable_compile_options(runtime::CompileEffort::Full, {}, true).size());
    auto exe = C().compile(dot_text, "dot", runtime::CompileEffort::Full, small);
    std::vector<float> a(60, 1.0f), bb(90, 2.0f);
    auto out = C().execute(*exe, {C().from_host(a.data(), DType::F32, {3, 4, 5}, 0).get(),
                                  C().from_host(bb.data(), DType::F32, {3, 5, 6}, 0).get()}, 0, true);
    CHECK(fetch<float>(*out[0]) == std::vector<float>(72, 10.0f));
  });

  // A chain of calls: call k reads call k-1 (a "backward"), and `late` reads `early`.
  auto chain_graph = [](int n, ir::GraphRef early_in, bool early_cheap) {
    std::vector<ir::GraphCall> g(n);
    for (int k = 0; k < n; ++k) {
      g[k].fn = k;
      g[k].out_bytes = {400};
      if (k > 0) g[k].args = {ir::GraphRef{k - 1, 0}};
    }
    g[1].args = {early_in};
    g[1].recomputable = early_cheap;
    g[n - 1].args.push_back(ir::GraphRef{1, 0});
    return g;
  };

  run("rematerialize: a late reader of a cheap value gets a recomputation that waits", [&] {
    auto g = chain_graph(12, ir::GraphRef{-1, 0}, true);  // call 1 reads a parameter
    ir::Rematerialized r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 1 && r.calls.size() == 13);
    const ir::GraphCall& copy = r.calls[11];  // just before the late reader
    CHECK(copy.fn == 1 && copy.after_arg == 0 && copy.after.node == r.position[10]);
    CHECK(r.calls[12].args[1].node == 11);                // the late reader reads the copy
    CHECK(r.calls[r.position[2]].args[0].node == r.position[1]);  // the early one the original
    // Not recomputable, or readers close together: nothing changes.
    CHECK(ir::rematerialize(chain_graph(12, ir::GraphRef{-1, 0}, false), {400}, 4).recomputed == 0);
    CHECK(ir::rematerialize(chain_graph(5, ir::GraphRef{-1, 0}, true), {400}, 4).recomputed == 0);
    g[10].out_bytes = {0};  // an empty value has no element to wait on
    CHECK(ir::rematerialize(g, {400}, 4).recomputed == 0);
  });

  run("rematerialize: a caller's fence (after_arg on an original call) follows its value", [&] {
    // DeferAndFuse fences checkpointing's recomputation this way; the copy placed before
    // call 11 moves the calls after it, the fence's value included.
    auto g = chain_graph(12, ir::GraphRef{-1, 0}, true);
    ir::GraphCall fenced;
    fenced.fn = 12;
    fenced.out_bytes = {400};
    fenced.args = {ir::GraphRef{11, 0}};
    fenced.after_arg = 0;
    fenced.after = ir::GraphRef{11, 0};
    g.push_back(fenced);
    ir::Rematerialized r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 1 && r.position[11] == 12);
    const ir::GraphCall& got = r.calls[r.position[12]];
    CHECK(got.after_arg == 0 && got.after.node == r.position[11] && got.args[0].node == r.position[11]);
  });

  run("rematerialize: inputs that died early are recomputed too, or nothing is", [&] {
    // Call 1 reads call 0, which nothing else reads late: 0 must run again first.
    auto g = chain_graph(12, ir::GraphRef{0, 0}, true);
    g[0].args = {ir::GraphRef{-1, 0}};
    g[0].recomputable = true;
    ir::Rematerialized r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 2 && r.calls.size() == 14);
    CHECK(r.calls[11].fn == 0 && r.calls[11].after_arg == 0);
    CHECK(r.calls[12].fn == 1 && r.calls[12].after_arg == -1 && r.calls[12].args[0].node == 11);
    g[0].recomputable = false;  // then recomputing 1 would keep 0 alive: leave it
    CHECK(ir::rematerialize(g, {400}, 4).recomputed == 0);
    g[0].recomputable = true;   // a call with no inputs has nothing to wait through
    g[0].args.clear();
    CHECK(ir::rematerialize(g, {400}, 4).recomputed == 0);
  });

  run("rematerialize: a chain's input that joins it late is read as the original", [] {
    // The backward of aminmax over a 0-d tensor in DeferAndFuse: all values the same
    // size, so an input skipped when one call was visited joined the chain after it,
    // and its recomputation read a copy not yet placed (a crash).
    const std::vector<std::pair<std::vector<ir::GraphRef>, int64_t>> spec = {
        {{{-1, 0}}, 4}, {{{-1, 0}}, 4}, {{{0, 0}}, 4}, {{{1, 0}}, 4},
        {{{2, 0}, {3, 0}, {-1, 1}}, 4}, {{{-1, 2}}, 4}, {{{0, 0}, {-1, 0}}, 1}, {{{6, 0}}, 8},
        {{{5, 0}, {7, 0}}, 4}, {{{8, 0}, {6, 0}}, 4}, {{{1, 0}, {-1, 0}}, 1}, {{{10, 0}}, 8},
        {{{5, 0}, {11, 0}}, 4}, {{{12, 0}, {10, 0}}, 4}, {{{9, 0}, {13, 0}, {-1, 1}}, 4}, {{{14, 0}}, 4}};
    std::vector<ir::GraphCall> g;
    for (size_t k = 0; k < spec.size(); ++k) {
      ir::GraphCall c;
      c.fn = static_cast<int>(k);
      c.args = spec[k].first;
      c.out_bytes = {spec[k].second};
      c.recomputable = true;
      g.push_back(c);
    }
    ir::Rematerialized r = ir::rematerialize(g, {4, 8, 4}, 4);
    CHECK(r.recomputed > 0 && r.calls.size() == g.size() + static_cast<size_t>(r.recomputed));
    for (size_t i = 0; i < r.calls.size(); ++i) {  // every call reads only calls placed before it
      for (const ir::GraphRef& a : r.calls[i].args) CHECK(a.node < static_cast<int>(i));
      CHECK(r.calls[i].after.node < static_cast<int>(i));
    }
  });

  // An MLP's linear -> gelu with both h (call 0) and gelu(h) (call 1) read late: gelu(h) at
  // `g_at` (the second linear's backward), h at `h_at` (gelu's backward); a chain between.
  auto mlp_graph = [](int g_at, int h_at) {
    const int n = std::max(g_at, h_at) + 2;
    std::vector<ir::GraphCall> g(n);
    for (int k = 0; k < n; ++k) {
      g[k].fn = k;
      g[k].out_bytes = {400};
      if (k > 0) g[k].args = {ir::GraphRef{k - 1, 0}};
    }
    g[0] = ir::GraphCall{0, {{-1, 0}}, {1600}, true};  // the linear that makes h (x is small)
    g[1] = ir::GraphCall{1, {{0, 0}}, {1600}, true};   // gelu(h)
    g[g_at].args.push_back(ir::GraphRef{1, 0});
    g[h_at].args.push_back(ir::GraphRef{0, 0});
    g[h_at].out_bytes = {1600};
    return g;
  };
  // Every call reads only calls placed before it, and one recomputation of `fn` at most.
  auto check_order = [](const ir::Rematerialized& r, int fn, int copies) {
    for (size_t i = 0; i < r.calls.size(); ++i) {
      for (const ir::GraphRef& a : r.calls[i].args) CHECK(a.node < static_cast<int>(i));
      CHECK(r.calls[i].after.node < static_cast<int>(i));
    }
    CHECK(std::count_if(r.calls.begin(), r.calls.end(), [&](const ir::GraphCall& c) { return c.fn == fn; }) ==
          copies + 1);
  };

  run("rematerialize: h and gelu(h) read late close together share one recomputation of the linear", [&] {
    // gelu(h) read first: gelu's chain recomputes the linear before it, and h's reader
    // (placed later) reads that copy instead of its own.
    auto g = mlp_graph(11, 12);
    ir::Rematerialized r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 2 && r.calls.size() == g.size() + 2);
    check_order(r, 0, 1);
    const ir::GraphCall& lin = r.calls[11];  // just before gelu(h)'s late reader
    CHECK(lin.fn == 0 && lin.after_arg == 0 && lin.after.node == r.position[10] && lin.args[0].node == -1);
    CHECK(r.calls[12].fn == 1 && r.calls[12].args[0].node == 11 && r.calls[12].after_arg == -1);
    CHECK(r.calls[r.position[11]].args[1].node == 12);  // gelu(h)'s reader reads the copy
    CHECK(r.calls[r.position[12]].args[1].node == 11);  // h's reader the same linear copy
    CHECK(r.calls[r.position[1]].args[0].node == r.position[0]);  // the early ones the originals
    CHECK(r.calls[r.position[2]].args[0].node == r.position[1]);
    // h read first: gelu's chain reads the linear recomputed for h's reader.
    g = mlp_graph(12, 11);
    r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 2 && r.calls.size() == g.size() + 2);
    check_order(r, 0, 1);
    CHECK(r.calls[11].fn == 0 && r.calls[11].after.node == r.position[10]);
    CHECK(r.calls[r.position[11]].args[1].node == 11);
    const ir::GraphCall& gelu = r.calls[r.position[11] + 1];
    CHECK(gelu.fn == 1 && gelu.args[0].node == 11 && gelu.after_arg == -1);
    CHECK(r.calls[r.position[12]].args[1].node == r.position[11] + 1);
    // Readers far apart: a shared copy would stay live between them, so each gets its own.
    g = mlp_graph(11, 17);
    r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 3);
    check_order(r, 0, 2);
    CHECK(r.calls[r.position[17]].args[1].node == r.position[17] - 1);
    CHECK(r.calls[r.position[17] - 1].fn == 0);
  });

  run("rematerialize: a linear's recomputed input moves with the shared copy", [&] {
    // layer_norm (0) -> linear (1) -> gelu (2), gelu(h) read at 12 and h at 13: one copy
    // of each, all placed before 12 (the layer_norm's own late copy is not emitted).
    std::vector<ir::GraphCall> g(15);
    for (int k = 0; k < 15; ++k) {
      g[k].fn = k;
      g[k].out_bytes = {400};
      if (k > 0) g[k].args = {ir::GraphRef{k - 1, 0}};
    }
    g[0].recomputable = true;
    g[0].args = {ir::GraphRef{-1, 0}};
    g[1] = ir::GraphCall{1, {{0, 0}}, {1600}, true};
    g[2] = ir::GraphCall{2, {{1, 0}}, {1600}, true};
    g[12].args.push_back(ir::GraphRef{2, 0});
    g[13].args.push_back(ir::GraphRef{1, 0});
    ir::Rematerialized r = ir::rematerialize(g, {400}, 4);
    CHECK(r.recomputed == 3 && r.calls.size() == g.size() + 3);
    check_order(r, 0, 1);
    check_order(r, 1, 1);
    CHECK(r.calls[12].fn == 0 && r.calls[12].after_arg == 0 && r.calls[12].after.node == r.position[11]);
    CHECK(r.calls[13].fn == 1 && r.calls[13].args[0].node == 12 && r.calls[13].after_arg == -1);
    CHECK(r.calls[14].fn == 2 && r.calls[14].args[0].node == 13);
    CHECK(r.calls[r.position[12]].args[1].node == 14 && r.calls[r.position[13]].args[1].node == 13);
  });

  run("rng_bit_generator is deterministic for a state", [] {
    auto gen = [] {
      Builder b;
      Value st = b.param(Type{DType::I64, {2}});
      auto [ns, bits] = b.rng_bit_generator(b.bitcast(st, DType::U64), Type{DType::U32, {8}});
      std::vector<int64_t> seed = {42, 7};
      auto out = run_program(b.finish({bits}), {C().from_host(seed.data(), DType::I64, {2}, 0)});
      return fetch<uint32_t>(*out[0]);
    };
    auto a = gen(), c = gen();
    CHECK(a == c);
    CHECK(a[0] != a[1]);
  });

  run("a compile failure raises with the program's name and the plugin's message", [] {
    try {
      C().compile("module { this is not mlir }", "aten::bogus");
      CHECK(false);
    } catch (const runtime::Error& e) {
      CHECK(std::string(e.what()).find("aten::bogus") != std::string::npos);
    }
  });

  run("memory limit raises OutOfMemory and keeps existing buffers", [] {
    std::vector<float> f(256, 2.f);
    auto keep = C().from_host(f.data(), DType::F32, {256}, 0);
    C().set_memory_limit(C().stats(0).live_bytes.load() + 100);
    bool raised = false;
    try {
      C().from_host(f.data(), DType::F32, {256}, 0);
    } catch (const runtime::OutOfMemory&) {
      raised = true;
    }
    C().set_memory_limit(0);
    CHECK(raised);
    CHECK(fetch<float>(*keep)[255] == 2.f);
  });

  run("devices list their memories", [] {
    auto kinds = C().memory_kinds(0);
    CHECK(!kinds.empty());
    for (auto& k : kinds) CHECK(!k.empty());
  });

  // A program that doubles its input, reading a buffer whose upload completes later.
  auto doubler = [] {
    Builder b;
    Value x = b.param(Type{DType::F32, {4}});
    return C().compile(b.finish({b.binary("stablehlo.add", x, x)}), "aten::add.Tensor(Float[4])");
  };

  run("an upload that lands after the launch feeds the program", [&] {
    auto exe = doubler();
    auto up = C().upload_later(DType::F32, {4}, 0);
    auto out = C().execute(*exe, {up->buffer().get()}, 0, false);  // waits on the data
    std::vector<float> v = {1, 2, 3, 4};
    up->complete(v.data(), 16);
    CHECK(fetch<float>(*out[0]) == std::vector<float>({2, 4, 6, 8}));
  });

  run("an asynchronous failure is raised at the next sync, naming the op", [&] {
    auto exe = doubler();
    auto up = C().upload_later(DType::F32, {4}, 0);
    auto out = C().execute(*exe, {up->buffer().get()}, 0, false);  // launch succeeds
    up->fail("DMA failed");
    std::string msg;
    try {
      C().synchronize();
    } catch (const runtime::Error& e) {
      msg = e.what();
    }
    CHECK(msg.find("aten::add.Tensor") != std::string::npos);
    CHECK(msg.find("DMA failed") != std::string::npos);
    C().synchronize();  // reported once; the client stays usable
    std::vector<float> ok = {1, 1, 1, 1};
    auto again = C().execute(*exe, {C().from_host(ok.data(), DType::F32, {4}, 0).get()}, 0, true);
    CHECK(fetch<float>(*again[0])[0] == 2.f);
  });

  run("with wait (Debug mode) the failure is raised by the launch itself", [&] {
    auto exe = doubler();
    auto up = C().upload_later(DType::F32, {4}, 0);
    up->fail("DMA failed");
    bool raised = false;
    try {
      C().execute(*exe, {up->buffer().get()}, 0, true);
    } catch (const runtime::Error& e) {
      raised = std::string(e.what()).find("aten::add.Tensor") != std::string::npos;
    }
    CHECK(raised);
  });


  // An imported module (as JAX exports it, in generic form): its functions join ours,
  // renamed per import, so one program can call two imports that both define @main.
  run("imported StableHLO modules are renamed, private and callable", [] {
    const std::string mod =
        "\"builtin.module\"() <{sym_name = \"jit_f\"}> ({\n"
        "  \"func.func\"() <{function_type = (tensor<3xf32>) -> tensor<3xf32>, sym_name = \"main\", sym_visibility = \"public\"}> ({\n"
        "  ^bb0(%arg0: tensor<3xf32>):\n"
        "    %0 = \"func.call\"(%arg0) <{callee = @sq}> : (tensor<3xf32>) -> tensor<3xf32>\n"
        "    \"func.return\"(%0) : (tensor<3xf32>) -> ()\n"
        "  }) : () -> ()\n"
        "  \"func.func\"() <{function_type = (tensor<3xf32>) -> tensor<3xf32>, sym_name = \"sq\"}> ({\n"
        "  ^bb0(%arg0: tensor<3xf32>):\n"
        "    %0 = \"stablehlo.multiply\"(%arg0, %arg0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>\n"
        "    \"func.return\"(%0) : (tensor<3xf32>) -> ()\n"
        "  }) : () -> ()\n"
        "}) {mhlo.num_partitions = 1 : i32} : () -> ()\n";
    Type t{DType::F32, {3}};
    ir::ExternalModule a = ir::import_module(mod, "a_", "test::a", {t}, {t});
    ir::ExternalModule b2 = ir::import_module(mod, "b_", "test::b", {t}, {t});
    CHECK(a.entry == "a_main" && a.functions.find("callee = @a_sq") != std::string::npos);
    CHECK(a.functions.find("\"public\"") == std::string::npos);
    Builder b;
    Value x = b.param(t);
    b.add_functions(a.entry, a.functions);
    b.add_functions(b2.entry, b2.functions);
    Value y = b.call(a.entry, {x}, {t})[0];
    Value z = b.call(b2.entry, {y}, {t})[0];
    std::vector<float> in = {1.f, 2.f, -3.f};
    auto out = run_program(b.finish({z}), {C().from_host(in.data(), DType::F32, {3}, 0)});
    CHECK(fetch<float>(*out[0]) == std::vector<float>({1.f, 16.f, 81.f}));
    bool refused = false;
    try {
      ir::import_module(mod, "c_", "test::c", {Type{DType::F32, {4}}}, {t});
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("test::c") != std::string::npos;
    }
    CHECK(refused);
  });

  run("programs' numbered functions are renamed by first appearance", [] {
    // Two processes that numbered the same graph's programs differently write one text.
    auto graph = [](int a, int b) {
      std::string fa = "@p" + std::to_string(a), fb = "@p" + std::to_string(b);
      return "func.func private " + fa + "(%x) {}\nfunc.func private " + fb + "(%x) {}\n" + fb +
             "_after1 main { callee = " + fa + "} {callee = " + fb + "} " + fa + "}" + " @pjit @p7x";
    };
    std::string one = ir::canonical_symbols(graph(86, 3), "p", "g");
    CHECK(one == ir::canonical_symbols(graph(12, 140), "p", "g"));
    CHECK(one.find("@g0(%x)") != std::string::npos && one.find("@g1_after1") != std::string::npos);
    CHECK(one.find("@pjit @p7x") != std::string::npos);  // other symbols keep their names
    CHECK(ir::canonical_symbols(graph(86, 86), "p", "g") != one);  // one function is not two
    // A text that already uses the new names is left alone.
    std::string taken = graph(5, 6) + " @g0";
    CHECK(ir::canonical_symbols(taken, "p", "g") == taken);
  });

  std::cout << g_passed << " passed, " << g_failed << " failed\n";
  return g_failed ? 1 : 0;
}
