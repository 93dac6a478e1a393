// Test-only: the checks of the suffix trees' invariants (tree.hpp's header comment) and their canonical form.
// Included only by the test module (_testing.cpp), never by the engine's core (_core.cpp).
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cache.hpp"
#include "tree.hpp"

namespace suffix_tree {

inline std::vector<long long> Tree::canonical() const {
  std::vector<long long> out;
  std::vector<i32> order(nodes_.size(), -1);
  std::vector<i32> stack{kRoot};
  i32 next = 0;
  while (!stack.empty()) {
    const i32 v = stack.back();
    stack.pop_back();
    order[v] = next++;
    const i32 dv = depth_of(v);
    std::vector<std::pair<i32, i32>> kids;  // (first token, node)
    for (i32 c = nodes_[v].first; c != kNone; c = nodes_[c].next) kids.emplace_back(str(c)[dv], c);
    std::sort(kids.begin(), kids.end());
    const Node& x = nodes_[v];
    const i32 best = x.best >= 0 ? str(x.best)[dv] : x.best;
    for (long long f : {(long long)dv, (long long)x.count, (long long)x.seq, (long long)x.start,
                        (long long)x.oldest, (long long)best, (long long)kids.size()})
      out.push_back(f);
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.push_back(it->second);
  }
  for (i32 s : live_) {
    const Seq& S = seqs_[s];
    out.push_back((long long)S.tok.size());
    for (size_t j = 0; j < S.tok.size(); ++j) {
      out.push_back(S.tok[j]);
      out.push_back(order[S.endp[j]]);
    }
    for (long long f : {(long long)S.active, (long long)S.rep_len, (long long)S.rep_seq, (long long)S.rep_next,
                        (long long)S.rep_first})
      out.push_back(f);
  }
  out.push_back(last_writer_);
  out.push_back((long long)num_nodes());
  out.push_back((long long)kids_.size());
  return out;
}

inline void Tree::validate() const {
  auto fail = [](const std::string& what, i32 v) {
    throw std::logic_error("suffix tree invariant broken at node " + std::to_string(v) + ": " + what);
  };
  const size_t N = nodes_.size();
  std::vector<char> freed(N, 0);
  for (i32 v : free_nodes_) freed[v] = 1;
  // Endpoints: where they sit, how many per node, and the most recent occurrence in each subtree.
  std::vector<i32> ends(N, 0);
  std::vector<std::pair<u64, i32>> newest(N, {0, -1});
  std::vector<i32> first(N, -1);  // smallest start below each node (checked in one-sequence trees)
  for (i32 s : live_) {
    const Seq& S = seqs_[s];
    const i32 n = i32(S.tok.size());
    if (S.endp.size() != S.tok.size()) fail("endpoint array size", s);
    for (i32 j = 0; j < n; ++j) {
      const i32 w = S.endp[j];
      if (w <= kRoot || w >= i32(N) || freed[w]) fail("endpoint on a dead node", w);
      const i32 dw = depth_of(w);
      if (dw != std::min(D_, n - j)) fail("endpoint depth", w);
      for (i32 k = 0; k < dw; ++k)
        if (str(w)[k] != S.tok[j + k]) fail("endpoint string", w);
      ends[w] += 1;
      const std::pair<u64, i32> key{S.order, j};
      for (i32 a = w; a != kRoot; a = nodes_[a].parent) {
        if (newest[a].second < 0 || key > newest[a]) newest[a] = key;
        if (first[a] < 0 || j < first[a]) first[a] = j;
      }
    }
    if (s == last_writer_)
      for (i32 j = std::max(0, n - D_ + 1); j < std::min(S.active, n); ++j)
      if (nodes_[S.endp[j]].depth != kOpen) fail("suffix below `active` is not an open leaf", S.endp[j]);
  }
  size_t live_count = 0;
  for (i32 v = 0; v < i32(N); ++v) {
    if (freed[v]) continue;
    ++live_count;
    const Node& x = nodes_[v];
    // Children: list links, counts, best child.
    i32 kids = 0, sum = 0, prev = kNone, best = kNone;
    const i32 dv = depth_of(v);
    for (i32 c = x.first; c != kNone; c = nodes_[c].next) {
      if (freed[c] || nodes_[c].parent != v || nodes_[c].prev != prev) fail("child list", c);
      ++kids;
      sum += nodes_[c].count;
      if (best == kNone || better(c, best)) best = c;
      prev = c;
    }
    if (x.best != kDirty && x.best != best) fail("cached best child", v);
    if (v == kRoot) continue;
    const i32 p = x.parent;
    if (p < 0 || p >= i32(N) || freed[p]) fail("parent", v);
    const i32 pd = depth_of(p);
    if (!(pd < dv && dv <= D_)) fail("depth", v);
    if (x.seq < 0 || x.seq >= i32(seqs_.size()) || !seqs_[x.seq].live) fail("reference sequence", v);
    if (x.start < 0 || x.start + dv > i32(seqs_[x.seq].tok.size())) fail("reference range", v);
    for (i32 k = 0; k < pd; ++k)
      if (str(v)[k] != str(p)[k]) fail("string disagrees with the parent's", v);
    if (kids_.find(p, str(v)[pd]) != v) fail("child map", v);
    if (x.count < 1 || x.count != ends[v] + sum) fail("count", v);
    if ((x.depth == kOpen) != (x.count == 1 && kids == 0)) fail("open leaf", v);
    if (kids == 1 && nodes_[x.first].count == x.count) fail("mergeable node", v);
    if (newest[v] != std::make_pair(seqs_[x.seq].order, x.start)) fail("reference is not the most recent", v);
    if (live_.size() == 1 && removed_ == 0 && x.oldest != first[v]) fail("oldest start", v);
  }
  if (kids_.size() != live_count - 1) fail("child map size", -1);
}

inline void Cache::validate() const {
  global_.validate();
  for (const auto& kv : reqs_) kv.second.local->validate();
}

}  // namespace suffix_tree
