#include "ir/remat.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

namespace tpu::ir {

RecomputeCost recompute_cost(const std::string& text) {
  static const char* never[] = {
      "stablehlo.convolution", "stablehlo.while",   "stablehlo.sort",       "stablehlo.rng",
      "stablehlo.custom_call", "stablehlo.scatter", "stablehlo.gather",     "stablehlo.fft",
      "stablehlo.reduce_window", "stablehlo.select_and_scatter", "stablehlo.triangular_solve",
      "stablehlo.cholesky",    "stablehlo.case",    "stablehlo.if",         "func.call"};
  for (const char* op : never)
    if (text.find(op) != std::string::npos) return RecomputeCost::Never;
  return text.find("stablehlo.dot_general") != std::string::npos ? RecomputeCost::Contraction
                                                                 : RecomputeCost::Cheap;
}

namespace {

// Recomputation `j` of those placed just before call `at` (at < 0: none).
struct Slot {
  int at = -1, j = -1;
  bool operator<(const Slot& o) const { return at != o.at ? at < o.at : j < o.j; }
};

struct Recompute {
  int of;                   // the original call
  std::vector<Slot> local;  // per argument: the recomputation it reads, or none (the original)
  GraphRef after;           // what it waits for (an original ref)
  int after_arg = -1;       // -1: it reads a recomputation, which waits already
};

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

Rematerialized rematerialize(const std::vector<GraphCall>& calls, const std::vector<int64_t>& param_bytes,
                             int gap) {
  const int n = static_cast<int>(calls.size());
  auto bytes = [&](const GraphRef& r) {
    return r.node < 0 ? param_bytes[r.index] : calls[r.node].out_bytes[r.index];
  };
  // Consumers of each call, in order, and for each value the last consumer that still
  // reads the original.
  std::vector<std::vector<int>> users(n);
  std::vector<int> first_value(n + 1, 0);
  for (int c = 0; c < n; ++c) first_value[c + 1] = first_value[c] + static_cast<int>(calls[c].out_bytes.size());
  std::vector<int> last_use_of(first_value[n], -1);
  auto last_use = [&](const GraphRef& r) -> int& { return last_use_of[first_value[r.node] + r.index]; };
  for (int c = 0; c < n; ++c)
    for (const GraphRef& a : calls[c].args) {
      if (a.node < 0) continue;
      if (users[a.node].empty() || users[a.node].back() != c) users[a.node].push_back(c);
      last_use(a) = c;
    }

  // Where the graph holds the most computed values (each live from its call to its last
  // reader): a recomputation pays only if the original would be live there.
  std::vector<int64_t> delta(n + 1, 0);
  for (int c = 0; c < n; ++c)
    for (size_t o = 0; o < calls[c].out_bytes.size(); ++o) {
      int last = last_use(GraphRef{c, static_cast<int>(o)});
      if (last <= c) continue;
      delta[c] += calls[c].out_bytes[o];
      delta[last] -= calls[c].out_bytes[o];
    }
  int peak_at = 0;
  int64_t live = 0, peak = -1;
  for (int c = 0; c < n; ++c) {
    live += delta[c];
    if (live >= peak) peak = live, peak_at = c;  // the last of equal peaks
  }

  std::vector<std::vector<Recompute>> before(n);
  std::map<std::pair<int, int>, Slot> subst;  // (consumer, arg) -> the recomputation it reads
  std::vector<std::vector<Slot>> copies(n);   // per call: its recomputations still in use
  std::map<Slot, Slot> moved;                 // a recomputation replaced by an earlier copy
  auto resolve = [&](Slot x) {
    for (auto it = moved.find(x); it != moved.end(); it = moved.find(x)) x = it->second;
    return x;
  };
  for (int p = 0; p < n; ++p) {
    const GraphCall& pc = calls[p];
    if (!pc.recomputable || pc.args.empty() || users[p].empty()) continue;
    // Split the consumers into groups separated by more than `gap` calls; the first
    // group (near p) reads the original.
    const int split = pc.gap > 0 ? pc.gap : gap;
    std::vector<std::vector<int>> groups{{}};
    int prev = p;
    for (int u : users[p]) {
      if (u - prev > split) groups.emplace_back();
      groups.back().push_back(u);
      prev = u;
    }
    std::vector<int> keep_last(pc.out_bytes.size(), -1);  // per output: last reader of the original
    auto keep = [&](int u) {
      for (const GraphRef& a : calls[u].args)
        if (a.node == p) keep_last[a.index] = std::max(keep_last[a.index], u);
    };
    for (int u : groups[0]) keep(u);
    for (size_t g = 1; g < groups.size(); ++g) {
      int s = groups[g].front();
      int prev_end = groups[g - 1].empty() ? p : groups[g - 1].back();
      // Something s reads that exists only after the previous group: the recomputation
      // waits for it (a value of a call that is not itself recomputed, preferably).
      GraphRef dep{-1, 0};
      for (const GraphRef& a : calls[s].args) {
        if (a.node <= prev_end || a.node == p || bytes(a) == 0) continue;  // after() reads an element
        bool better = dep.node < 0 || (calls[dep.node].recomputable && !calls[a.node].recomputable) ||
                      (calls[dep.node].recomputable == calls[a.node].recomputable && a.node > dep.node);
        if (better) dep = a;
      }
      // What to run again: p, after whichever of its inputs are neither live near s
      // anyway nor small next to what reads them, recomputed in turn (two levels).
      std::vector<int> chain;
      bool ok = dep.node >= 0 && prev_end < peak_at && peak_at < s;
      std::function<void(int, int)> need = [&](int c, int depth) {
        if (!ok || std::find(chain.begin(), chain.end(), c) != chain.end()) return;
        for (const GraphRef& a : calls[c].args) {
          if (a.node < 0 || last_use(a) >= s - gap || bytes(a) * 8 <= total(calls[c].out_bytes)) continue;
          if (depth == 0 || !calls[a.node].recomputable || calls[a.node].args.empty()) {
            ok = false;
            return;
          }
          need(a.node, depth - 1);
        }
        chain.push_back(c);
      };
      need(p, 2);
      // Each recomputation that reads no other waits through its smallest input; that
      // input may be copied (when XLA cannot fuse the wait into the recomputation), so
      // it must not be larger than what the recomputation saves.
      // A recomputation reads another only when that one is placed before it: an input
      // skipped as live when one call was visited may join the chain later, after it.
      auto earlier_in_chain = [&](size_t e, const GraphRef& a) -> int {
        if (a.node < 0) return -1;
        auto end = chain.begin() + static_cast<std::ptrdiff_t>(e);
        auto it = std::find(chain.begin(), end, a.node);
        return it == end ? -1 : static_cast<int>(it - chain.begin());
      };
      std::vector<int> wait_arg(chain.size(), -1);
      for (size_t e = 0; ok && e < chain.size(); ++e) {
        const auto& args = calls[chain[e]].args;
        if (std::any_of(args.begin(), args.end(), [&](const GraphRef& a) { return earlier_in_chain(e, a) >= 0; }))
          continue;
        int k = static_cast<int>(std::min_element(args.begin(), args.end(), [&](const GraphRef& x, const GraphRef& y) {
                                   return bytes(x) < bytes(y);
                                 }) - args.begin());
        if (bytes(args[k]) > total(calls[chain[e]].out_bytes)) ok = false;
        wait_arg[e] = k;
      }
      if (!ok) {
        for (int u : groups[g]) keep(u);
        continue;
      }
      // Chains placed for readers close together share their recomputations of one call
      // (h and gelu(h) both read late each recompute the linear that makes h): an
      // element with a copy already placed at most `gap` calls before s reads that copy,
      // and the elements only it needed are dropped.
      std::vector<Slot> slot(chain.size());
      std::vector<bool> needed(chain.size(), false);
      for (size_t e = 0; e < chain.size(); ++e)
        for (const Slot& x : copies[chain[e]])
          if (x.at <= s && s - x.at <= gap && (slot[e].at < 0 || slot[e] < x)) slot[e] = x;
      needed.back() = true;
      for (size_t e = chain.size(); e-- > 0;) {
        if (!needed[e] || slot[e].at >= 0) continue;
        for (const GraphRef& a : calls[chain[e]].args)
          if (int at = earlier_in_chain(e, a); at >= 0) needed[at] = true;
      }
      for (size_t e = 0; e < chain.size(); ++e) {
        if (!needed[e] || slot[e].at >= 0) continue;
        Recompute r{chain[e], {}, dep, wait_arg[e]};
        for (const GraphRef& a : calls[chain[e]].args) {
          int at = earlier_in_chain(e, a);
          r.local.push_back(at >= 0 ? slot[at] : Slot{});
          if (at < 0 && a.node >= 0) last_use(a) = std::max(last_use(a), s);
        }
        slot[e] = Slot{s, static_cast<int>(before[s].size())};
        before[s].push_back(std::move(r));
        // A copy of the same call placed at most `gap` calls later reads this one instead.
        auto& placed = copies[chain[e]];
        for (auto it = placed.begin(); it != placed.end();) {
          if (it->at > s && it->at - s <= gap) {
            moved[*it] = slot[e];
            it = placed.erase(it);
          } else {
            ++it;
          }
        }
        placed.push_back(slot[e]);
      }
      for (int u : groups[g])
        for (size_t k = 0; k < calls[u].args.size(); ++k)
          if (calls[u].args[k].node == p) subst[{u, static_cast<int>(k)}] = slot.back();
    }
    for (size_t o = 0; o < keep_last.size(); ++o) last_use(GraphRef{p, static_cast<int>(o)}) = keep_last[o];
  }

  // Recomputations still read (by a consumer, or by one that is): a copy replaced by an
  // earlier one, and what only it read, are not emitted. Reads go only to earlier slots.
  std::vector<std::vector<bool>> used(n);
  for (int c = 0; c < n; ++c) used[c].assign(before[c].size(), false);
  for (const auto& [where, x] : subst) {
    Slot r = resolve(x);
    used[r.at][r.j] = true;
  }
  for (int c = n; c-- > 0;)
    for (size_t j = before[c].size(); j-- > 0;)
      if (used[c][j])
        for (const Slot& x : before[c][j].local)
          if (x.at >= 0) {
            Slot r = resolve(x);
            used[r.at][r.j] = true;
          }

  Rematerialized out;
  out.position.assign(n, -1);
  std::vector<std::vector<int>> made(n);  // new positions of before[c]
  auto place = [&](const GraphRef& r) { return r.node < 0 ? r : GraphRef{out.position[r.node], r.index}; };
  auto copy_of = [&](const Slot& x, int index) {
    Slot r = resolve(x);
    return GraphRef{made[r.at][r.j], index};
  };
  for (int c = 0; c < n; ++c) {
    made[c].assign(before[c].size(), -1);
    for (size_t j = 0; j < before[c].size(); ++j) {
      if (!used[c][j]) continue;
      const Recompute& rc = before[c][j];
      GraphCall copy = calls[rc.of];
      for (size_t k = 0; k < copy.args.size(); ++k)
        copy.args[k] = rc.local[k].at >= 0 ? copy_of(rc.local[k], copy.args[k].index) : place(copy.args[k]);
      copy.after_arg = rc.after_arg;
      copy.after = place(rc.after);
      made[c][j] = static_cast<int>(out.calls.size());
      out.calls.push_back(std::move(copy));
      ++out.recomputed;
    }
    GraphCall call = calls[c];
    if (call.after_arg >= 0) call.after = place(call.after);  // a caller's fence
    for (size_t k = 0; k < call.args.size(); ++k) {
      auto it = subst.find({c, static_cast<int>(k)});
      if (it == subst.end()) call.args[k] = place(call.args[k]);
      else call.args[k] = copy_of(it->second, call.args[k].index);
    }
    out.position[c] = static_cast<int>(out.calls.size());
    out.calls.push_back(std::move(call));
  }
  return out;
}

}  // namespace tpu::ir
