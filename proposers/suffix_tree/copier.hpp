// Copy drafts: continue the request's own text where its tail occurred before.
//
// Count-based drafts (tree.hpp) trust frequencies. Inside one request, what predicts best is an exact repeat
// and *where* the text is being copied from: a rewrite (code edit) reproduces its prompt with a few changes,
// and a looping answer repeats itself. A copy draft's path probability is the product, over its tokens, of the
// reliability h(m) of a copy after m matched tokens (spec_plugins/copy_hazard.hpp), with m growing by one per
// token.
//
// A Copier follows one source position in the request's sequence. While the new tokens equal the source's it
// just advances. On a mismatch it re-chooses from the longest repeated tail (Seq::rep_*):
//   * after a copy of >= anchor_run tokens broke off, the broken-off source position is the anchor: an edit
//     replaces a few tokens and the text resumes shortly after, so for a short tail (<= near_len) the
//     occurrence just after the anchor (within `window` tokens, longest match first, then nearest) is taken,
//     and counts as near_bonus more matched tokens -- from its second token on; its first counts
//     near_first_bonus more;
//   * otherwise a short tail (oldest_from..near_len tokens) copies its oldest occurrence (in a rewrite that is
//     the original text; the newest is often the copy just written), and a long tail its most recent
//     occurrence (recency wins for long matches).
// The state is a function of the token sequence alone (not of when drafts are asked for).
//
// The constants below were fitted on replayed requests (docs/notes/suffix-tree-variants.md); each is the default
// of the suffix-tree proposer's option copy_<name> (copy_drafts for `on`; proposers/suffix_tree/proposer.py).
#pragma once

#include <algorithm>
#include <vector>

#include "../../spec_plugins/copy_hazard.hpp"
#include "tree.hpp"

namespace suffix_tree {

struct CopyParams {
  bool on = true;
  // Stop before a token whose path probability is below this.
  double min_prob = 0.05;
  // After an edit, how far past the anchor a short tail looks for its occurrence.
  i32 window = 16;
  // Tails up to this long prefer the occurrence after the anchor, else the oldest one.
  i32 near_len = 8;
  // A copy at least this long that breaks off marks the anchor.
  i32 anchor_run = 3;
  // Short tails at least this long copy their oldest occurrence; 0: always the most recent one.
  i32 oldest_from = 2;
  // A copy near the anchor counts as this many more matched tokens, from its second token on ...
  double near_bonus = 2.0;
  // ... and its first token only this many more: whether the edit is over at all is a coin toss (replays: a
  // one-token near copy's first token was right 0.33-0.43 of the time, where h(1 + 2) = 0.66 claimed; once that
  // token is right the rest follow h(1 + 2 + k)).
  double near_first_bonus = 0.5;
  // Where the copy and the count draft start with different tokens, the request's text and the trees disagree,
  // and whichever wins is right less often than its confidence says (replays: a copy after a one-token match
  // 0.13-0.14 of the time against 0.27-0.34 when they agree, but 0.24 on code completion; a count draft that
  // wins 0.23-0.40 where it claimed ~0.5). The winner's path probabilities are multiplied by this; its tokens,
  // the choice and the score stay. 0.7, not the 0.5 most workloads fit: 0.5 cost code completion at batch 1.
  double disagree_factor = 0.7;
  // h(m) = 1 - hazard_c / (m + hazard_d): spec_plugins/copy_hazard.hpp.
  double hazard_c = spec_plugins::kHazardC, hazard_d = spec_plugins::kHazardD;

  double hazard(double m) const { return spec_plugins::copy_hazard(m, hazard_c, hazard_d); }
};

class Copier {
 public:
  // Seq S (a per-request tree's only sequence) has just grown by one token.
  void step(const Seq& S, const CopyParams& cp) {
    const i32* x = S.tok.data();
    const i32 n = i32(S.tok.size()) - 1;
    if (src_ != kNone && x[src_] == x[n]) {
      ++src_;
      ++len_;
      ++run_;
      return;
    }
    if (src_ != kNone && run_ >= cp.anchor_run) anchor_ = src_;
    run_ = 0;
    choose(S, cp);
  }

  // Up to max_tokens tokens from the source (past the end of the sequence the copy repeats itself,
  // as a loop does), while the path probability stays >= min_prob. Never longer than the sequence.
  void draft(const Seq& S, i32 max_tokens, const CopyParams& cp, Draft& out) const {
    out.tokens.clear();
    out.probs.clear();
    out.score = 0.0;
    out.match_len = 0;
    if (src_ == kNone) return;
    const i32 n = i32(S.tok.size());
    const i32 room = std::min(max_tokens, n);
    const double m = len_ + (near_ ? cp.near_bonus : 0.0);
    const double m_first = len_ + (near_ ? cp.near_first_bonus : 0.0);
    double p = 1.0, s = 0.0;
    for (i32 k = 0; k < room; ++k) {
      p *= cp.hazard(k == 0 ? m_first : m + k);
      if (p < cp.min_prob) break;
      const i32 pos = src_ + k;
      out.tokens.push_back(pos < n ? S.tok[pos] : out.tokens[pos - n]);
      out.probs.push_back(p);
      s += p;
    }
    out.score = s;
    if (!out.tokens.empty()) out.match_len = len_;
  }

  i32 src() const { return src_; }
  i32 len() const { return len_; }
  i32 anchor() const { return anchor_; }
  bool near() const { return near_; }

 private:
  void choose(const Seq& S, const CopyParams& cp) {
    const i32* x = S.tok.data();
    const i32 n = i32(S.tok.size()) - 1;
    const i32 L = S.rep_len;
    near_ = false;
    len_ = L;
    if (L == 0) {
      src_ = kNone;
      return;
    }
    if (L <= cp.near_len) {
      if (anchor_ != kNone) {
        i32 best_len = 0, best_pos = kNone;
        const i32 hi = i32(std::min<long long>((long long)anchor_ + cp.window, n + 1));
        for (i32 p = std::max(anchor_, 1); p < hi; ++p) {  // x[p - 1] ends an occurrence, p <= n
          i32 l = 0;
          while (l < L && l < p && x[p - 1 - l] == x[n - l]) ++l;
          if (l > best_len) {
            best_len = l;
            best_pos = p;
          }
        }
        if (best_len > 0) {
          src_ = best_pos;
          len_ = best_len;
          near_ = true;
          return;
        }
      }
      if (cp.oldest_from > 0 && L >= cp.oldest_from) {
        src_ = S.rep_first;
        return;
      }
    }
    src_ = S.rep_next;
  }

  i32 src_ = kNone;     // position predicted to come next (< sequence length), kNone: no guess
  i32 len_ = 0;         // tokens before src_ known to agree with the tail
  i32 run_ = 0;         // tokens predicted right since the last re-choice
  i32 anchor_ = kNone;  // where the last long copy broke off
  bool near_ = false;   // src_ was found near the anchor
};

}  // namespace suffix_tree
