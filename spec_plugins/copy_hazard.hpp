// How often a copied token is right: the one definition of the reliability both the suffix tree's copy drafts
// (proposers/suffix_tree/copier.hpp) and the n-gram proposer's confidences (proposers/ngram/proposer.py, which
// reads these constants from its compiled core) use.
//
// A draft that continues an exact match of m tokens so far (a copy of the request's own text, a prompt-lookup
// n-gram) gets its next token right with probability close to
//
//     h(m) = 1 - c / (m + d),   c = kHazardC = 1.3,  d = kHazardD = 0.8
//
// (0.28 at m = 1, 0.85 at 8, 0.92 at 16), on code edits, chat and code completion alike: measured as the
// fraction of copied tokens accepted given m on replayed requests, with drafts always K long (the table is in
// docs/notes/suffix-tree-variants.md, "What the copy draft does"). A copy's path probability is the product of h
// over its tokens, with m growing by one per token.
#pragma once

namespace spec_plugins {

constexpr double kHazardC = 1.3;
constexpr double kHazardD = 0.8;

// P(the next copied token is right | m tokens matched so far), never below 0.
inline double copy_hazard(double m, double c = kHazardC, double d = kHazardD) {
  const double h = 1.0 - c / (m + d);
  return h > 0.0 ? h : 0.0;
}

}  // namespace spec_plugins
