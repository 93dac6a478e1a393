// Depth-limited suffix trees with occurrence counts, for SuffixDecoding drafts.
//
// A Tree holds sequences of token ids. Every start position j of every sequence contributes one
// "suffix" x[j .. j+L) with L = min(max_depth, len - j); count(s) is the number of occurrences of the
// string s (|s| <= max_depth), i.e. the number of suffixes that pass through s. A draft continues a
// matched string by its most frequent continuation; the probability of each token is the product of
// count(child) / count(parent) along the path. A request can also draft by copying its own text
// (copier.hpp); the two kinds of draft compete on expected accepted tokens (cache.hpp).
//
// Representation (path-compressed, indices only, no per-node heap objects):
//   * A node stands for a chain of trie positions with equal counts; it stores the depth of its last
//     position and a reference occurrence (seq, start) of its whole string, so its edge tokens are
//     seq[start + depth(parent) .. start + depth). The reference is always the most recent occurrence
//     (largest (sequence order, start)): FIFO eviction of the oldest sequence can then never leave a
//     surviving node pointing into freed tokens, and the same key breaks count ties ("most recent").
//   * Each node also keeps the start of its first occurrence (`oldest`; exact in a per-request tree,
//     which never evicts), so a repeat's oldest occurrence is as cheap as its most recent one.
//   * Each suffix's end ("endpoint") sits exactly at the end of a node; seq.endp[j] remembers that node.
//     The endpoints of a sequence's last max_depth suffixes are the per-request match positions, and
//     removing a sequence walks up from its endpoints without any token comparison.
//   * A node with count 1 and no children is an "open leaf": its depth is implicit,
//     min(max_depth, len(seq) - start), so a suffix that is unique grows for free. Appending a token
//     therefore only touches the suffixes whose string occurred before (plus at most one new leaf),
//     not all max_depth of them.
//   * Nodes are canonical: apart from the root, a node with a single child holds at least one
//     endpoint (otherwise it is merged into the child), so the tree has at most 2 nodes per suffix.
//   * Children are found through one open-addressing hash map keyed by (parent, first token); a
//     doubly linked sibling list is kept only for enumeration. Each node caches its best child
//     (highest count, ties by recency); increments keep it exact in O(1),
//     decrements (eviction only) mark it dirty and it is recomputed the next time a draft needs it.
//
// Everything is deterministic: no decision depends on hash order, node ids or addresses.
//
// A tree's appends can also be tentative ("tentative appends" below): journaled, so that the newest of them
// can be taken back exactly (appending drafts ahead, ahead.hpp). The checks of the invariants above are
// test-only (check.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../page_arena.hpp"
#include "child_map.hpp"

namespace suffix_tree {

constexpr i32 kDirty = -2;  // Node::best: unknown since a child's count went down
constexpr i32 kOpen = -1;   // Node::depth of an open leaf
constexpr i32 kRoot = 0;

struct Node {
  i32 parent;
  i32 count;   // occurrences of every string on this node's edge
  i32 depth;   // length of the node's string; kOpen for an open leaf
  i32 seq;     // reference occurrence: sequence slot ...
  i32 start;   // ... and start position
  i32 oldest;  // start of the first occurrence inserted (exact only in a tree of one sequence)
  i32 best;    // most frequent child, kNone or kDirty
  i32 first, next, prev;  // child list, for enumeration only
};

struct Seq {
  spec_plugins::ArenaVector<i32> tok;   // the arrays a step reads at random are on 2 MB pages (page_arena.hpp)
  spec_plugins::ArenaVector<i32> endp;  // endp[j]: node at whose end suffix j currently ends
  u64 order = 0;          // insertion order; larger is younger
  i32 active = 0;         // suffixes j < active (in the last max_depth) are open leaves
  bool live = false;
  // The longest tail of tok (<= max_depth) that occurred before, as of the last append: its length
  // (0: even the last token is new), and where the token after its most recent earlier occurrence
  // sits (sequence rep_seq, position rep_next; with several sequences that occurrence may end its
  // sequence). rep_first is the same for the oldest occurrence, exact only in a tree that only ever
  // held this sequence (a per-request tree). Found while appending, at the cost of one child lookup;
  // the copy drafts read them.
  i32 rep_len = 0, rep_seq = 0, rep_next = 0, rep_first = 0;
};

struct SpecParams {
  double factor = 1.0;    // per-match budget: floor(factor * match_len + offset)
  double offset = 0.0;
  double min_prob = 0.1;  // stop before a token whose path probability is below this
};

class Tree;

struct Draft {
  std::vector<i32> tokens;
  std::vector<double> probs;
  double score = 0.0;  // sum of probs: expected accepted tokens under the count model
  i32 match_len = 0;   // 0 when the draft is empty
  // Where a count draft's path stopped, so that Tree::continue_path can follow it further: the tree it
  // followed (nullptr for other drafts), and the node and depth reached.
  Tree* tree = nullptr;
  i32 end_node = kNone, end_depth = 0;

  // How many leading tokens have a path probability >= p (path probabilities never increase).
  size_t leading_at_least(double p) const {
    size_t m = 0;
    while (m < probs.size() && probs[m] >= p) ++m;
    return m;
  }
};

class Tree {
 public:
  explicit Tree(i32 max_depth) : D_(max_depth) {
    if (max_depth < 1) throw std::invalid_argument("max_depth: expected >= 1");
    nodes_.push_back(Node{kNone, 0, 0, 0, 0, 0, kNone, kNone, kNone, kNone});
  }

  i32 max_depth() const { return D_; }

  // A new empty sequence, younger than all others; returns its slot.
  i32 add_seq(size_t expected_len = 0) {
    i32 s;
    if (!free_seqs_.empty()) {
      s = free_seqs_.back();
      free_seqs_.pop_back();
    } else {
      s = i32(seqs_.size());
      seqs_.emplace_back();
    }
    Seq& S = seqs_[s];
    S.order = next_order_++;
    S.active = 0;
    S.live = true;
    S.rep_len = 0;
    S.tok.reserve(expected_len);
    S.endp.reserve(expected_len);
    live_.push_back(s);
    if (expected_len && num_nodes() == 1) {  // a fresh (per-request) tree: typical size
      nodes_.reserve(expected_len + expected_len / 4 + 1);
      kids_.reserve(expected_len + expected_len / 4);
    }
    return s;
  }

  void extend(i32 s, const i32* tok, size_t n) {
    for (size_t i = 0; i < n; ++i) append(s, tok[i]);
  }
  void push(i32 s, i32 t) { append(s, t); }

  // Removes the oldest sequence (FIFO is what keeps references valid, see the header comment).
  i32 remove_oldest() {
    if (live_.empty()) throw std::logic_error("remove_oldest: the tree holds no sequence");
    const i32 s = live_.front();
    live_.pop_front();
    Seq& S = seqs_[s];
    ++removed_;
    // Increasing j: among a node's endpoints from S the reference one (largest start) goes last.
    for (size_t j = 0; j < S.endp.size(); ++j) drop(S.endp[j]);
    decltype(S.tok)().swap(S.tok);
    decltype(S.endp)().swap(S.endp);
    S.live = false;
    free_seqs_.push_back(s);
    return s;
  }

  size_t num_seqs() const { return live_.size(); }
  const Seq& seq(i32 s) const { return seqs_[s]; }
  bool is_live(i32 s) const { return s >= 0 && s < i32(seqs_.size()) && seqs_[s].live; }
  size_t num_nodes() const { return nodes_.size() - free_nodes_.size(); }

  size_t memory_bytes() const {
    size_t b = sizeof(*this) + nodes_.capacity() * sizeof(Node) + free_nodes_.capacity() * sizeof(i32) +
               kids_.bytes() + seqs_.capacity() * sizeof(Seq) + free_seqs_.capacity() * sizeof(i32);
    for (const Seq& S : seqs_) b += (S.tok.capacity() + S.endp.capacity()) * sizeof(i32);
    return b;
  }

  // Occurrences of pattern (0 when absent or longer than max_depth).
  i32 count(const i32* pat, i32 len) const {
    if (len < 1 || len > D_) return 0;
    i32 v, d;
    return locate(pat, len, v, d) ? nodes_[v].count : 0;
  }

  // Drafts for the context ctx[0..n) (walked from the root for each match length); replaces `best`
  // only by a strictly higher score. If the context ends with the whole of live sequence `own` (a
  // response cached while in flight), the endpoints of `own` give the shorter match positions.
  void speculate(const i32* ctx, i32 n, i32 max_tokens, const SpecParams& sp, Draft& best, i32 own = kNone) {
    if (live_.empty() || max_tokens <= 0) return;
    const i32 m = own == kNone ? 0 : std::min(i32(seqs_[own].tok.size()), n);
    i32 lo = std::min(m, D_ - 1), hi = std::min(n, D_ - 1), v, d;
    while (lo < hi) {  // occurrence is monotone in the match length: binary search the longest
      const i32 mid = (lo + hi + 1) / 2;
      if (locate(ctx + n - mid, mid, v, d)) lo = mid;
      else hi = mid - 1;
    }
    search(lo, max_tokens, sp, best, [&](i32 L, i32& node, i32& depth) {
      if (L > m) return locate(ctx + n - L, L, node, depth);
      node = seqs_[own].endp[m - L];
      depth = L;
      return true;
    });
  }

  // Drafts for sequence s's own context, in a tree that holds only s (a per-request tree). Its
  // endpoints are the match positions, and suffixes that are open leaves occur only at the end, so
  // only the last n - active lengths can continue.
  void speculate_self(i32 s, i32 max_tokens, const SpecParams& sp, Draft& best) {
    const Seq& S = seqs_[s];
    const i32 n = i32(S.tok.size());
    if (max_tokens <= 0 || S.active >= n) return;
    const i32 lmax = std::min(n - S.active, D_ - 1);
    search(lmax, max_tokens, sp, best, [&](i32 L, i32& node, i32& depth) {
      node = seqs_[s].endp[n - L];
      depth = L;
      return true;
    });
  }

  // Between begin_shared_reads() and end_shared_reads() speculate() may run on several threads at
  // once (nothing else may): lazily recomputed best children are cached only at the end.
  void begin_shared_reads() { shared_reads_ = true; }
  void end_shared_reads() {
    shared_reads_ = false;
    for (i32 p : deferred_) best_child(p);
    deferred_.clear();
  }

  // Test-only, defined in check.hpp (built into the test module alone): a consistency check that throws
  // std::logic_error naming the first broken invariant, ...
  void validate() const;
  // ... and the tree's content independent of node ids and hash layout (two trees that must be the
  // same): nodes in depth-first order, children by first token, each with its depth, count, reference,
  // oldest start, best child and number of children; then each live sequence's tokens, endpoints (as
  // depth-first positions) and scalars.
  std::vector<long long> canonical() const;

  // ---- tentative appends -------------------------------------------------------------------------
  // Tokens appended to sequence s after begin_tentative(s, m) (at most m, through append_tentative)
  // can be taken back, newest first. While the journal is open every write to a node, an endpoint or
  // a child slot records the old value first, allocations only grow the node array (no free-list
  // reuse), the child map is reserved so it never rehashes, and each token records the sequence's
  // scalars. take_back(keep) restores the tree exactly (byte for byte, capacities aside) as it was
  // after the first `keep` tentative tokens, and closes the journal: those stay as ordinary appends.
  // Only for a tree nothing else writes meanwhile (a per-request tree between two engine steps).
  void begin_tentative(i32 s, size_t m) {
    if (journal_) throw std::logic_error("begin_tentative: a journal is already open");
    kids_.reserve(kids_.size() + (size_t(D_) + 1) * m);  // a token adds at most max_depth + 1 keys
    journal_ = true;
    jseq_ = s;
    jcap_ = m;
    kids_.journal(true);
    node_log_.clear();
    endp_log_.clear();
    marks_.clear();
  }
  void append_tentative(i32 t) {
    if (!journal_ || marks_.size() >= jcap_) throw std::logic_error("append_tentative: no room in the journal");
    const Seq& S = seqs_[jseq_];
    marks_.push_back(Mark{node_log_.size(), endp_log_.size(), kids_.journal_size(), kids_.size(), nodes_.size(),
                          free_nodes_.size(), S.tok.size(), S.active, S.rep_len, S.rep_seq, S.rep_next,
                          S.rep_first, last_writer_});
    append(jseq_, t);
  }
  void take_back(size_t keep) {
    if (!journal_) return;
    if (keep < marks_.size()) {
      const Mark& m = marks_[keep];
      for (size_t i = node_log_.size(); i > m.node_log; --i) nodes_[node_log_[i - 1].first] = node_log_[i - 1].second;
      Seq& S = seqs_[jseq_];
      for (size_t i = endp_log_.size(); i > m.endp_log; --i) S.endp[endp_log_[i - 1].first] = endp_log_[i - 1].second;
      kids_.undo(m.kid_log, m.kids_size);
      nodes_.resize(m.nodes);
      free_nodes_.resize(m.free_nodes);
      S.tok.resize(m.len);
      S.endp.resize(m.len);
      S.active = m.active;
      S.rep_len = m.rep_len;
      S.rep_seq = m.rep_seq;
      S.rep_next = m.rep_next;
      S.rep_first = m.rep_first;
      last_writer_ = m.last_writer;
    }
    journal_ = false;
    kids_.journal(false);
    node_log_.clear();
    endp_log_.clear();
    marks_.clear();
  }

 private:
  // ---- basic accessors -------------------------------------------------------------------------
  // Every write to a node goes through mut() (and to an endpoint through set_endpoint), so that a
  // journal of tentative appends can restore it; the journal is off on the engine's step, so its
  // records are kept out of line, off the hot path.
  Node& mut(i32 v) {
    if (__builtin_expect(journal_, false)) log_node(v);
    return nodes_[v];
  }
  void set_endpoint(i32 T, i32 j, i32 v) {
    if (__builtin_expect(journal_, false)) log_endpoint(T, j);
    seqs_[T].endp[j] = v;
  }
  __attribute__((noinline, cold)) void log_node(i32 v) { node_log_.emplace_back(v, nodes_[v]); }
  __attribute__((noinline, cold)) void log_endpoint(i32 T, i32 j) { endp_log_.emplace_back(j, seqs_[T].endp[j]); }
  i32 depth_of(i32 v) const {
    const Node& x = nodes_[v];
    if (x.depth >= 0) return x.depth;
    return std::min<i32>(D_, i32(seqs_[x.seq].tok.size()) - x.start);
  }
  // The node's string: str(v)[k] is its (k+1)-th token.
  const i32* str(i32 v) const { return seqs_[nodes_[v].seq].tok.data() + nodes_[v].start; }
  bool only_child(i32 c) const { return nodes_[c].prev == kNone && nodes_[c].next == kNone; }

  i32 alloc() {
    if (!free_nodes_.empty() && !journal_) {  // a journal undoes allocations by truncation
      const i32 v = free_nodes_.back();
      free_nodes_.pop_back();
      return v;
    }
    nodes_.emplace_back();
    return i32(nodes_.size() - 1);
  }
  void release(i32 v) {
    Node& x = mut(v);
    x.count = 0;
    x.parent = kNone;
    free_nodes_.push_back(v);
  }

  // Child list.
  void link(i32 p, i32 c) {
    Node& x = mut(c);
    x.parent = p;
    x.prev = kNone;
    x.next = nodes_[p].first;
    if (x.next != kNone) mut(x.next).prev = c;
    mut(p).first = c;
  }
  void unlink(i32 c) {
    const Node x = nodes_[c];
    if (x.prev != kNone) mut(x.prev).next = x.next;
    else mut(x.parent).first = x.next;
    if (x.next != kNone) mut(x.next).prev = x.prev;
  }
  void replace(i32 old, i32 nw) {  // nw takes old's place among its siblings
    const Node o = nodes_[old];
    Node& n = mut(nw);
    n.parent = o.parent;
    n.prev = o.prev;
    n.next = o.next;
    if (o.prev != kNone) mut(o.prev).next = nw;
    else mut(o.parent).first = nw;
    if (o.next != kNone) mut(o.next).prev = nw;
  }

  // ---- ordering of continuations ---------------------------------------------------------------
  // Does child a beat its sibling b? The higher count; on equal counts the more recent occurrence (a
  // token-id order was measured to draft no better: docs/notes/suffix-tree-variants.md).
  bool better(i32 a, i32 b) const {
    const Node& x = nodes_[a];
    const Node& y = nodes_[b];
    if (x.count != y.count) return x.count > y.count;
    const u64 ox = seqs_[x.seq].order, oy = seqs_[y.seq].order;
    if (ox != oy) return ox > oy;
    return x.start > y.start;
  }
  void raise_best(i32 p, i32 c) {  // c's count just went up
    const i32 b = nodes_[p].best;
    if (b == kDirty) return;
    if (b == kNone || (b != c && better(c, b))) mut(p).best = c;
  }
  i32 best_child(i32 p) {
    i32 b = nodes_[p].best;
    if (b != kDirty) return b;
    b = nodes_[p].first;
    if (b != kNone)
      for (i32 c = nodes_[b].next; c != kNone; c = nodes_[c].next)
        if (better(c, b)) b = c;
    if (shared_reads_) {
      // Several threads draft from this tree at once: leave the node as it is and cache its best
      // child after they are done (end_shared_reads), so readers never race a writer.
      std::lock_guard<std::mutex> lock(*deferred_mu_);
      deferred_.push_back(p);
      return b;
    }
    nodes_[p].best = b;
    return b;
  }
  // Occurrence (T, j) is now counted in closed node v: keep the most recent one as reference.
  void touch(i32 v, i32 T, i32 j) {
    const Node& y = nodes_[v];
    if (y.seq == T ? j > y.start : seqs_[T].order > seqs_[y.seq].order) {
      Node& x = mut(v);
      x.seq = T;
      x.start = j;
    }
  }

  // ---- insertion -------------------------------------------------------------------------------
  void append(i32 T, i32 t) {
    Appending a;
    append_begin(T, t, a, 2);
    while (!append_done(a))
      if (append_probe(a)) append_apply(a);
    append_end(a);
  }

 public:
  // One token's append in steps, so that several trees' appends can be interleaved (Cache::feed_group):
  // append_begin, then while !append_done: append_probe, and append_apply where the probe says so, then
  // append_end. Each step prefetches what the step after it reads, `ahead` suffixes on; between two
  // steps of one tree the others' run, which hides those loads. A tree's own steps keep their order, so
  // the tree is the same as after append().
  struct Appending {
    i32 T, t, n, j;   // sequence, token, its length before the token, the suffix being extended
    i32 lo;           // the first suffix that may still grow
    i32 ahead;        // how many suffixes on to prefetch
    i32 u = kNone, c = kNone;  // the probed suffix's node and its child on t (kNone: none)
  };
  void append_begin(i32 T, i32 t, Appending& a, i32 ahead) {
    Seq& S = seqs_[T];
    const i32 n = i32(S.tok.size());
    S.tok.push_back(t);  // open leaves of T are one token longer from here on
    S.endp.push_back(kRoot);
    // Suffixes j < n + 1 - D have reached max_depth; those below `active` are open leaves, unless
    // another sequence was appended since (it may have repeated one of them: in-flight caching).
    const i32 lo = std::max(last_writer_ == T ? S.active : 0, n + 1 - D_);
    last_writer_ = T;
    S.rep_len = 0;
    a.T = T;
    a.t = t;
    a.n = n;
    a.j = a.lo = lo;
    a.ahead = ahead;
    for (i32 j = lo; j <= std::min(lo + ahead - 1, n); ++j) prefetch_suffix(S, j, t);
  }
  bool append_done(const Appending& a) const { return a.j > a.n; }
  // Longest first: each suffix sees the tree with all longer suffixes already extended. False when
  // suffix j is an open leaf (it grows by itself: nothing to apply, the probe moved on); else its child
  // on t is found and loaded, for append_apply.
  bool append_probe(Appending& a) {
    const Seq& S = seqs_[a.T];
    const i32 u = S.endp[a.j];
    if (a.j < a.n && nodes_[u].depth == kOpen) {
      next_suffix(a);
      return false;
    }
    a.u = u;
    a.c = kids_.find(u, a.t);
    if (a.c != kNone) __builtin_prefetch(&nodes_[a.c]);
    const i32 b = nodes_[u].best;
    if (b >= 0) __builtin_prefetch(&nodes_[b]);
    return true;
  }
  void append_apply(Appending& a) {
    Seq& S = seqs_[a.T];
    if (S.rep_len == 0 && a.c != kNone) {
      // The first suffix that continues into an existing child is the longest repeated tail; the
      // child's reference and oldest start are its most recent and first earlier occurrences.
      S.rep_len = a.n + 1 - a.j;
      S.rep_seq = nodes_[a.c].seq;
      S.rep_next = nodes_[a.c].start + S.rep_len;
      S.rep_first = nodes_[a.c].oldest + S.rep_len;
    }
    step(a.T, a.j, a.u, a.t, a.c);
    next_suffix(a);
  }
  void append_end(const Appending& a) {
    // Unique suffixes form a prefix of the window (a string that ends with a unique string is
    // unique), so `active` only moves forward.
    Seq& S = seqs_[a.T];
    i32 j = a.lo;
    while (j <= a.n && nodes_[S.endp[j]].depth == kOpen) ++j;
    S.active = j;
  }

 private:
  void prefetch_suffix(const Seq& S, i32 j, i32 t) const {
    const i32 u = S.endp[j];
    __builtin_prefetch(&nodes_[u]);
    kids_.prefetch(u, t);
  }
  void next_suffix(Appending& a) const {
    ++a.j;
    const i32 k = a.j + a.ahead - 1;  // the suffix `ahead` on from the next one to probe
    if (k <= a.n) prefetch_suffix(seqs_[a.T], k, a.t);
  }

  // Suffix j of sequence T ends at node u (at its end; u is the root for the new empty suffix);
  // extend it by token t. c is u's child on t (kids_.find(u, t)), or kNone.
  void step(i32 T, i32 j, i32 u, i32 t, i32 c) {
    const i32 du = nodes_[u].depth;  // u is closed: it holds this endpoint and more occurrences
    if (c == kNone) {  // new continuation: an open leaf
      const i32 w = alloc();
      mut(w) = Node{u, 1, kOpen, T, j, j, kNone, kNone, kNone, kNone};
      link(u, w);
      kids_.insert(u, t, w);
      raise_best(u, w);
      set_endpoint(T, j, w);
      return;
    }
    const i32 dc = depth_of(c);
    if (dc == du + 1) {  // c's edge is one token: the endpoint moves onto c
      Node& x = mut(c);
      x.depth = dc;  // freezes an open leaf that now has a second occurrence
      x.count += 1;
      touch(c, T, j);
      set_endpoint(T, j, c);
      raise_best(u, c);
      // u lost this endpoint; if nothing else ends at u and c is its only child, they merge.
      if (u != kRoot && nodes_[u].count == nodes_[c].count && only_child(c)) absorb(u, c);
      return;
    }
    const i32 next_tok = str(c)[du + 1];
    if (u != kRoot && nodes_[u].count == nodes_[c].count + 1 && only_child(c)) {
      // Only this endpoint ends at u and every other occurrence of u continues into c: slide u's
      // end one token down c's edge instead of splitting c and merging u into the new node.
      mut(u).depth = du + 1;
      kids_.erase(u, t);
      kids_.insert(u, next_tok, c);
      touch(u, T, j);
      return;
    }
    // Split c after its first token; the new upper node v holds the endpoint.
    const i32 v = alloc();
    const Node cc = nodes_[c];
    mut(v) = Node{u, cc.count + 1, du + 1, cc.seq, cc.start, cc.oldest, c, kNone, kNone, kNone};
    replace(c, v);
    kids_.assign(u, t, v);
    Node& x = mut(c);
    x.parent = v;
    x.prev = x.next = kNone;
    mut(v).first = c;
    kids_.insert(v, next_tok, c);
    touch(v, T, j);
    if (nodes_[u].best == c) mut(u).best = v;
    raise_best(u, v);
    set_endpoint(T, j, v);
  }

  // u (not the root) has only child c and no endpoint of its own: c takes u's place.
  void absorb(i32 u, i32 c) {
    const i32 p = nodes_[u].parent;
    const i32 pd = nodes_[p].depth;
    const i32 tu = str(u)[pd];
    const i32 tc = str(c)[nodes_[u].depth];
    kids_.erase(u, tc);
    replace(u, c);
    kids_.assign(p, tu, c);
    if (nodes_[p].best == u) mut(p).best = c;
    release(u);
  }

  // ---- removal ---------------------------------------------------------------------------------
  // Removes one endpoint at w's end: every node from w up loses one occurrence.
  void drop(i32 w) {
    i32 v = w;
    // Nodes reaching count 0 are childless (children never outnumber their parent); they are at
    // the bottom of the path.
    while (v != kRoot) {
      Node& x = nodes_[v];
      const i32 p = x.parent;
      if (--x.count > 0) break;
      kids_.erase(p, str(v)[depth_of(p)]);
      unlink(v);
      if (nodes_[p].best == v) nodes_[p].best = kDirty;
      release(v);
      v = p;
    }
    const i32 fix = v;  // the lowest survivor
    if (v != kRoot) {
      if (nodes_[nodes_[v].parent].best == v) nodes_[nodes_[v].parent].best = kDirty;
      for (i32 a = nodes_[v].parent; a != kRoot; a = nodes_[a].parent) {
        nodes_[a].count -= 1;
        if (nodes_[nodes_[a].parent].best == a) nodes_[nodes_[a].parent].best = kDirty;
      }
    }
    // Restore canonical form at the one node whose own endpoints or children changed.
    if (fix == kRoot) return;
    Node& f = nodes_[fix];
    if (f.first == kNone) {
      // Childless: its count is its endpoints. One endpoint left -> an open leaf; the reference is
      // that endpoint's occurrence (largest start among what remains), so the implicit depth agrees.
      if (f.count == 1) f.depth = kOpen;
      f.best = kNone;
    } else if (only_child(f.first) && nodes_[f.first].count == f.count) {
      absorb(fix, f.first);
    }
  }

  // ---- matching and drafting -------------------------------------------------------------------
  // Position of pattern p[0..L): node v whose edge contains depth L. False if it does not occur.
  bool locate(const i32* p, i32 L, i32& node, i32& depth) const {
    i32 v = kRoot, k = 0;
    while (k < L) {
      const i32 c = kids_.find(v, p[k]);
      if (c == kNone) return false;
      const i32* sc = str(c);
      const i32 e = std::min(depth_of(c), L);
      for (++k; k < e; ++k)
        if (sc[k] != p[k]) return false;
      v = c;
    }
    node = v;
    depth = L;
    return true;
  }

  static i32 budget(i32 L, i32 max_tokens, const SpecParams& sp) {
    const double b = std::floor(L * sp.factor + sp.offset + 1e-6);
    if (!(b > 0)) return 0;
    return b >= max_tokens ? max_tokens : i32(b);
  }

  // Tries match lengths lmax..1 (all of which occur), keeping the best score; a shorter match wins
  // only with a strictly higher score. A length whose budget cannot beat the best is skipped, and
  // since budgets shrink with the length, the loop stops at the first such budget.
  template <class Locus>
  void search(i32 lmax, i32 max_tokens, const SpecParams& sp, Draft& best, Locus locus) {
    for (i32 L = lmax; L >= 1; --L) {
      const i32 b = budget(L, max_tokens, sp);
      if (b <= best.score) break;
      const i32 room = std::min(b, D_ - L);
      if (room <= best.score) continue;
      i32 v, d;
      if (!locus(L, v, d)) continue;
      // Per thread, not per tree: the global tree is searched by several threads in a batched step.
      thread_local Draft scratch;
      if (follow(v, d, room, sp.min_prob, best.score, scratch) && scratch.score > best.score) {
        std::swap(best.tokens, scratch.tokens);
        std::swap(best.probs, scratch.probs);
        best.score = scratch.score;
        best.match_len = L;
        best.tree = this;
        best.end_node = scratch.end_node;
        best.end_depth = scratch.end_depth;
      }
    }
  }

  // Follows the most frequent continuation from depth d on node v for up to `room` tokens.
  // Returns false as soon as the draft provably cannot score above `floor`.
  bool follow(i32 v, i32 d, i32 room, double min_prob, double floor, Draft& out) {
    out.tokens.clear();
    out.probs.clear();
    double p = 1.0, s = 0.0;
    i32 dv = depth_of(v);
    const i32* sv = str(v);
    for (i32 k = 0; k < room; ++k) {
      if (d == dv) {
        const i32 c = best_child(v);
        if (c == kNone) break;
        p *= double(nodes_[c].count) / double(nodes_[v].count);
        if (p < min_prob) break;
        // Probabilities never increase along the path: room - k more tokens add at most p each.
        if (s + p * (room - k) <= floor - 1e-9) return false;
        v = c;
        dv = depth_of(c);
        sv = str(c);
      }
      out.tokens.push_back(sv[d]);
      out.probs.push_back(p);
      s += p;
      ++d;
    }
    out.score = s;
    out.end_node = out.tokens.empty() ? kNone : v;  // every way out of the loop leaves (v, d) after the last token
    out.end_depth = d;
    return true;
  }

 public:
  // Continues count draft `out` (drafted by this tree: out.tree == this) along the same most frequent path
  // with no probability floor and no budget, up to max_tokens tokens or the tree's depth: for a runner
  // that verifies every draft slot anyway (the rest would be padding). Path probabilities go on falling;
  // out.probs must still be the path probabilities follow() wrote (before any reliability is applied).
  void continue_path(Draft& out, i32 max_tokens) {
    if (out.tree != this || out.end_node == kNone) return;
    i32 v = out.end_node, d = out.end_depth, dv = depth_of(v);
    const i32* sv = str(v);
    double p = out.probs.back();
    const i32 room = std::min(max_tokens, D_ - out.match_len);
    while (i32(out.tokens.size()) < room) {
      if (d == dv) {
        const i32 c = best_child(v);
        if (c == kNone) break;
        p *= double(nodes_[c].count) / double(nodes_[v].count);
        v = c;
        dv = depth_of(c);
        sv = str(c);
      }
      out.tokens.push_back(sv[d]);
      out.probs.push_back(p);
      ++d;
    }
  }

 private:

  const i32 D_;
  spec_plugins::ArenaVector<Node> nodes_;
  std::vector<i32> free_nodes_;
  ChildMap kids_;
  std::vector<Seq> seqs_;
  std::vector<i32> free_seqs_;
  std::deque<i32> live_;  // live sequence slots, oldest first
  u64 next_order_ = 0;
  u64 removed_ = 0;          // sequences evicted so far (Node::oldest is exact while none is)
  i32 last_writer_ = kNone;  // sequence appended last
  bool shared_reads_ = false;
  std::vector<i32> deferred_;  // dirty nodes met during shared reads
  // The journal of tentative appends (begin_tentative): old values, and per token where it began.
  struct Mark {
    size_t node_log, endp_log, kid_log, kids_size, nodes, free_nodes, len;
    i32 active, rep_len, rep_seq, rep_next, rep_first, last_writer;
  };
  bool journal_ = false;
  i32 jseq_ = kNone;
  size_t jcap_ = 0;
  std::vector<std::pair<i32, Node>> node_log_;
  std::vector<std::pair<i32, i32>> endp_log_;
  std::vector<Mark> marks_;
  std::unique_ptr<std::mutex> deferred_mu_ = std::make_unique<std::mutex>();
};

}  // namespace suffix_tree
