// Appending drafts ahead: while the engine verifies a step's drafts, each request's tree can already take the
// leading draft tokens (those whose path probability is at least the proposer's ahead_min_prob): tentatively,
// journaled (tree.hpp, "tentative appends"). The next step keeps the ones that agree with the request's new
// tokens and takes the rest back (settle), so only what was not guessed is appended while the engine waits.
// Trees, copiers and drafts end exactly as without it. Only per-request trees take tokens ahead: not with
// in-flight caching (the global tree would be written between steps).
//
// Cache::append_ahead (cache.hpp) does it for a step's requests; the binding (_core.cpp) runs that on a thread
// of its own after a step that has at least the proposer's ahead_min_tokens such tokens.
#pragma once

#include <cstddef>
#include <vector>

#include "copier.hpp"
#include "tree.hpp"

namespace suffix_tree {

// One request's tokens appended ahead and not settled yet, with its copier before each of them.
class Ahead {
 public:
  size_t size() const { return tokens_.size(); }
  bool empty() const { return tokens_.empty(); }

  // Appends tok[0 .. m) to sequence s of `tree` (a per-request tree) tentatively, stepping `copier` after
  // each token as an ordinary append does. Nothing may be pending (settle first).
  void append(Tree& tree, i32 s, Copier& copier, const CopyParams& cp, const i32* tok, size_t m) {
    tree.begin_tentative(s, m);
    tokens_.assign(tok, tok + m);
    for (size_t i = 0; i < m; ++i) {
      copiers_.push_back(copier);
      tree.append_tentative(tok[i]);
      if (cp.on) copier.step(tree.seq(s), cp);
    }
  }

  // Keeps the tentative tokens up to the first that differs from tok[0 .. count), takes back the rest (from
  // the tree and the copier); returns how many were kept (tok[0 .. kept) are in the tree).
  size_t settle(Tree& tree, Copier& copier, const i32* tok, size_t count) {
    const size_t m = tokens_.size();
    if (m == 0) return 0;
    size_t kept = 0;
    while (kept < m && kept < count && tokens_[kept] == tok[kept]) ++kept;
    tree.take_back(kept);
    if (kept < m) copier = copiers_[kept];
    tokens_.clear();
    copiers_.clear();
    return kept;
  }

 private:
  std::vector<i32> tokens_;      // appended tentatively, oldest first
  std::vector<Copier> copiers_;  // the request's copier before each of them
};

}  // namespace suffix_tree
