// Depth-limited suffix trees with occurrence counts, for SuffixDecoding drafts.
//
// A Tree holds sequences of token ids. Every start position j of every sequence contributes one
// "suffix" x[j .. j+L) with L = min(max_depth, len - j); count(s) is the number of occurrences of the
// string s (|s| <= max_depth), i.e. the number of suffixes that pass through s. A draft continues a
// matched string by its most frequent continuation; the probability of each token is the product of
// count(child) / count(parent) along the path. A request can also draft by copying its own text
// (Copier, "copy drafts" below); the two kinds of draft compete on expected accepted tokens.
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
//     (highest count, ties by recency or by smaller token); increments keep it exact in O(1),
//     decrements (eviction only) mark it dirty and it is recomputed the next time a draft needs it.
//
// Everything is deterministic: no decision depends on hash order, node ids or addresses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../page_arena.hpp"
#include "../worker_pool.hpp"

namespace suffix_tree {

using i32 = std::int32_t;
using u64 = std::uint64_t;

constexpr i32 kNone = -1;
constexpr i32 kDirty = -2;  // Node::best: unknown since a child's count went down
constexpr i32 kOpen = -1;   // Node::depth of an open leaf
constexpr i32 kRoot = 0;

// (parent, token) -> child, linear probing with backward-shift deletion (no tombstones).
class ChildMap {
 public:
  ChildMap() { rehash(16); }

  i32 find(i32 parent, i32 tok) const {
    const u64 k = key(parent, tok);
    for (size_t i = home(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return s.val;
      if (s.key == kEmpty) return kNone;
    }
  }

  void insert(i32 parent, i32 tok, i32 child) {  // the key must be absent
    if ((size_ + 1) * 2 > slots_.size()) {
      if (journal_) throw std::logic_error("ChildMap: rehash while journaling (reserve before)");
      rehash(slots_.size() * 2);
    }
    put(key(parent, tok), child);
    ++size_;
  }

  void assign(i32 parent, i32 tok, i32 child) {
    const size_t i = locate(key(parent, tok));
    write(i, Slot{slots_[i].key, child});
  }

  // Starts loading the slot where (parent, tok) would be: the caller probes it soon, and trees of many
  // requests together do not fit in cache.
  void prefetch(i32 parent, i32 tok) const { __builtin_prefetch(&slots_[home(key(parent, tok))]); }

  void erase(i32 parent, i32 tok) {
    size_t i = locate(key(parent, tok));
    write(i, Slot{kEmpty, slots_[i].val});
    --size_;
    // Shift back later entries of the probe run that would otherwise become unreachable.
    for (size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool stays = (i < j) ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        write(i, slots_[j]);
        write(j, Slot{kEmpty, slots_[j].val});
        i = j;
      }
    }
  }

  void reserve(size_t n) {
    size_t cap = slots_.size();
    while (n * 2 > cap) cap *= 2;
    if (cap != slots_.size()) rehash(cap);
  }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

  // Journal (Tree's tentative appends): while on, every slot write first records the slot's old
  // contents, so undo() can restore the map exactly. Inserts must not rehash meanwhile (reserve first).
  void journal(bool on) {
    journal_ = on;
    log_.clear();
  }
  size_t journal_size() const { return log_.size(); }
  void undo(size_t to, size_t size) {  // back to when the journal held `to` records and the map `size` keys
    for (size_t i = log_.size(); i > to; --i) slots_[log_[i - 1].first] = log_[i - 1].second;
    log_.resize(to);
    size_ = size;
  }

 private:
  struct Slot {
    u64 key;
    i32 val;
  };
  void write(size_t i, Slot s) {
    if (__builtin_expect(journal_, false)) log_slot(i);
    slots_[i] = s;
  }
  __attribute__((noinline, cold)) void log_slot(size_t i) { log_.emplace_back(i, slots_[i]); }
  static constexpr u64 kEmpty = ~u64(0);  // parent and token are both < 2^31, so never a real key

  static u64 key(i32 parent, i32 tok) { return (u64(std::uint32_t(parent)) << 32) | std::uint32_t(tok); }
  size_t home(u64 k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }

  size_t locate(u64 k) const {
    size_t i = home(k);
    while (slots_[i].key != k) i = (i + 1) & mask_;
    return i;
  }

  void put(u64 k, i32 v) {
    size_t i = home(k);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    write(i, Slot{k, v});
  }

  void rehash(size_t cap) {
    spec_plugins::ArenaVector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{kEmpty, 0});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    for (const Slot& s : old)
      if (s.key != kEmpty) put(s.key, s.val);
  }

  spec_plugins::ArenaVector<Slot> slots_;  // on 2 MB pages (page_arena.hpp): probed at random
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
  bool journal_ = false;
  std::vector<std::pair<size_t, Slot>> log_;
};

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

enum class TieBreak { kRecent, kToken };

struct SpecParams {
  double factor = 1.0;    // per-match budget: floor(factor * match_len + offset)
  double offset = 0.0;
  double min_prob = 0.1;  // stop before a token whose path probability is below this
};

struct Draft {
  std::vector<i32> tokens;
  std::vector<double> probs;
  double score = 0.0;  // sum of probs: expected accepted tokens under the count model
  i32 match_len = 0;   // 0 when the draft is empty

  // How many leading tokens have a path probability >= p (path probabilities never increase).
  size_t leading_at_least(double p) const {
    size_t m = 0;
    while (m < probs.size() && probs[m] >= p) ++m;
    return m;
  }
};

class Tree {
 public:
  explicit Tree(i32 max_depth, TieBreak tie = TieBreak::kRecent) : D_(max_depth), tie_(tie) {
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

  // Consistency check for tests: throws std::logic_error naming the first broken invariant.
  void validate() const;
  // The tree's content independent of node ids and hash layout (tests: two trees that must be the
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
  // Does child a beat its sibling b? pd is the parent's depth (used by the token rule).
  bool better(i32 a, i32 b, i32 pd) const {
    const Node& x = nodes_[a];
    const Node& y = nodes_[b];
    if (x.count != y.count) return x.count > y.count;
    if (tie_ == TieBreak::kRecent) {
      const u64 ox = seqs_[x.seq].order, oy = seqs_[y.seq].order;
      if (ox != oy) return ox > oy;
      return x.start > y.start;
    }
    return str(a)[pd] < str(b)[pd];
  }
  void raise_best(i32 p, i32 c, i32 pd) {  // c's count just went up
    const i32 b = nodes_[p].best;
    if (b == kDirty) return;
    if (b == kNone || (b != c && better(c, b, pd))) mut(p).best = c;
  }
  i32 best_child(i32 p) {
    i32 b = nodes_[p].best;
    if (b != kDirty) return b;
    const i32 pd = depth_of(p);
    b = nodes_[p].first;
    if (b != kNone)
      for (i32 c = nodes_[b].next; c != kNone; c = nodes_[c].next)
        if (better(c, b, pd)) b = c;
    if (shared_reads_) {
      // Several threads draft from this tree at once: leave the node as it is and cache its best
      // child after they are done (settle_deferred), so readers never race a writer.
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
      raise_best(u, w, du);
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
      raise_best(u, c, du);
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
    raise_best(u, v, du);
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
    return true;
  }

  const i32 D_;
  const TieBreak tie_;
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

// ---- copy drafts: continue the request's own text where its tail occurred before ----------------
// Count-based drafts trust frequencies. Inside one request, what predicts best is an exact repeat
// and *where* the text is being copied from: a rewrite (code edit) reproduces its prompt with a few
// changes, and a looping answer repeats itself. Measured on replayed requests (see
// docs/notes/suffix-tree-variants.md): with a match of m tokens so far, the next copied token is right
// with probability close to h(m) = 1 - c / (m + d) (c = 1.3, d = 0.8: 0.28 at m = 1, 0.85 at 8,
// 0.92 at 16) on code edits, chat and code completion alike. A copy draft's path probability is the
// product of h over its tokens, with m growing by one per token.
//
// A Copier follows one source position in the request's sequence. While the new tokens equal the
// source's it just advances. On a mismatch it re-chooses from the longest repeated tail (Seq::rep_*):
//   * after a copy of >= anchor_run tokens broke off, the broken-off source position is the anchor:
//     an edit replaces a few tokens and the text resumes shortly after, so for a short tail
//     (<= near_len) the occurrence just after the anchor (within `window` tokens, longest match
//     first, then nearest) is taken, and counts as near_bonus more matched tokens -- from its second
//     token on: whether the edit is over at all is a coin toss, so its first token counts only
//     near_first_bonus more (replays: a one-token near copy's first token was right 0.33-0.43 of the
//     time, h(1 + 2) = 0.66 claimed; once that token is right the rest follow h(1 + 2 + k));
//   * otherwise a short tail (oldest_from..near_len tokens) copies its oldest occurrence (in a rewrite
//     that is the original text; the newest is often the copy just written), and a long tail its most
//     recent occurrence (recency wins for long matches).
// The state is a function of the token sequence alone (not of when drafts are asked for).
struct CopyParams {
  bool on = true;
  double min_prob = 0.05;  // stop before a token whose path probability is below this
  i32 window = 16;
  i32 near_len = 8;
  i32 anchor_run = 3;
  i32 oldest_from = 2;  // 0: always the most recent occurrence
  double near_bonus = 2.0;
  double near_first_bonus = 0.5;
  double disagree_factor = 0.7;  // the draft's path probabilities where the copy and count drafts' first tokens differ
  double hazard_c = 1.3, hazard_d = 0.8;

  double hazard(double m) const {  // P(next copied token is right | m tokens matched so far)
    const double h = 1.0 - hazard_c / (m + hazard_d);
    return h > 0.0 ? h : 0.0;
  }
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

// ---- requests: one tree per request plus the global FIFO cache of responses --------------------
struct CacheOptions {
  i32 max_depth = 24;  // with copy drafts, deeper trees cost more and draft no better
  long long max_cached = 10000;  // 0 disables the global tree
  bool cache_active = false;     // also insert in-flight responses into the global tree
  TieBreak tie = TieBreak::kRecent;
  SpecParams spec;
  CopyParams copy;
};

class Cache {
  struct Req {
    std::unique_ptr<Tree> local;
    Copier copier;
    i32 seq = 0;
    size_t prompt_len = 0;
    i32 gseq = kNone;  // in-flight slot in the global tree (cache_active), kNone once evicted
    bool copied = false;  // the last draft was a copy draft (diagnostics: calibration per kind)
    std::vector<i32> ahead;              // tokens appended tentatively (append_ahead), not yet settled
    std::vector<Copier> ahead_copiers;   // the copier before each of them
  };

 public:
  explicit Cache(const CacheOptions& o) : o_(o), global_(o.max_depth, o.tie) {}

  const CacheOptions& options() const { return o_; }

  void start(long long key, const std::vector<i32>& prompt) {
    if (reqs_.count(key)) throw std::invalid_argument("request is already started");
    Req r;
    r.local = std::make_unique<Tree>(o_.max_depth, o_.tie);
    r.seq = r.local->add_seq(prompt.size());
    feed(r, prompt.data(), prompt.size());
    r.prompt_len = prompt.size();
    if (o_.cache_active && o_.max_cached > 0) {
      make_room();
      r.gseq = global_.add_seq();
      owner_[r.gseq] = key;
    }
    reqs_.emplace(key, std::move(r));
  }

  void append(long long key, const i32* tok, size_t n) {
    Req& r = settled(key);
    feed(r, tok, n);
    if (r.gseq != kNone) global_.extend(r.gseq, tok, n);
  }

  size_t length(long long key) {
    const Req& r = settled(key);
    return r.local->seq(r.seq).tok.size();
  }

  Draft speculate(long long key, i32 max_tokens, double price = 0.0) {
    return speculate(settled(key), max_tokens, price);
  }

  // price: the adaptive policy's least survival a kept token can have this step (DraftBatch.token_price): the
  // draft is the unpriced one up to its last token whose path probability is >= price. The candidates are
  // chosen as unpriced (choosing them net of the price lost modelled goodput on the replays, see
  // docs/notes/results-log.md), so a priced draft is always a prefix of the unpriced one.
  // The score stays the unpriced draft's.
  Draft speculate(Req& r, i32 max_tokens, double price = 0.0) {
    Draft best;
    speculate_into(r, max_tokens, price, best);
    return best;
  }

  // The same into `best`, whose buffers a batched step keeps from one step to the next (no allocation
  // per request and step).
  void speculate_into(Req& r, i32 max_tokens, double price, Draft& best) {
    speculate_unpriced(r, max_tokens, best);
    if (price > 0.0) {
      const size_t keep = best.leading_at_least(price);
      best.tokens.resize(keep);
      best.probs.resize(keep);
      if (keep == 0) {
        best.match_len = 0;
        r.copied = false;  // as unpriced: an empty draft came from no candidate
      }
    }
  }

  void speculate_unpriced(Req& r, i32 max_tokens, Draft& best) {
    best.tokens.clear();
    best.probs.clear();
    best.score = 0.0;
    best.match_len = 0;
    best.tokens.reserve(max_tokens);  // one allocation per draft, not one per doubling
    best.probs.reserve(max_tokens);
    r.copied = false;
    r.local->speculate_self(r.seq, max_tokens, o_.spec, best);
    const Seq& S = r.local->seq(r.seq);
    global_.speculate(S.tok.data(), i32(S.tok.size()), max_tokens, o_.spec, best, r.gseq);  // local wins ties
    if (!o_.copy.on) return;
    // Counts overrate short matches (after one matching token a count ratio of 0.5 is right about
    // 0.2 of the time), so the count draft's expected accepted tokens are discounted by the same
    // match-length reliability h as copies before the two compete; the copy wins ties.
    double s = 0.0;
    for (size_t k = 0; k < best.probs.size(); ++k) s += best.probs[k] * o_.copy.hazard(double(best.match_len) + k);
    best.score = s;
    thread_local Draft copy;  // per thread: a batched step drafts on several
    copy.tokens.reserve(max_tokens);
    copy.probs.reserve(max_tokens);
    r.copier.draft(S, max_tokens, o_.copy, copy);
    r.copied = !copy.tokens.empty() && copy.score >= best.score;
    // The two candidates' first tokens differ: the request's text and the trees disagree, and whichever wins
    // is right less often than its confidence says (replays: a copy after a one-token match 0.13-0.14 of the
    // time against 0.27-0.34 when they agree, but 0.24 on code completion; a count draft that wins 0.23-0.40
    // where it claimed ~0.5). The tokens, the choice and the score stay; the path probabilities (what the
    // policy trims by) say so. 0.7, not the 0.5 most workloads fit: 0.5 cost code completion at batch 1.
    const double agreement = !best.tokens.empty() && !copy.tokens.empty() && best.tokens[0] != copy.tokens[0]
                                 ? o_.copy.disagree_factor
                                 : 1.0;
    if (r.copied) {
      if (agreement != 1.0)
        for (double& p : copy.probs) p *= agreement;
      std::swap(best.tokens, copy.tokens);
      std::swap(best.probs, copy.probs);
      best.score = copy.score;
      best.match_len = copy.match_len;
      return;
    }
    // The count draft's probabilities get the same reliability: a count ratio says which continuation is
    // most frequent, not how often a match of this length continues at all (raw ratios predicted 0.71-0.77
    // at the first token where 0.27-0.29 were accepted, on every replay workload). Token k's conditional
    // confidence becomes ratio_k * h(match_len + k), as a copy's is h(m + k).
    double h = agreement;
    for (size_t k = 0; k < best.probs.size(); ++k) {
      h *= o_.copy.hazard(double(best.match_len) + double(k));
      best.probs[k] *= h;
    }
  }

  const Copier& copier(long long key) { return settled(key).copier; }
  bool copied(long long key) { return get(key).copied; }

  // One engine step for a whole batch, rows with distinct keys. Row i either continues its request
  // (tok[0..count) are the tokens appended since it was last seen) or starts it (tok[0..count) is the
  // whole context; kRestart first finishes the request the key named before). What writes the global
  // tree -- starts, restarts, and every append when in-flight responses are cached -- runs first, on
  // this thread, in row order. Then each row's own work (its appends, then its draft, while its tree
  // is in cache) runs on `pool` when the batch has at least `parallel_from` rows: per-request trees
  // are independent and the global tree is only read.
  enum RowKind : signed char { kContinue = 0, kStart = 1, kRestart = 2 };
  struct Row {
    long long key;
    const i32* tok;
    size_t count;
    i32 max_tokens;
    RowKind kind;
    Req* req = nullptr;  // a continuing row's request, found by classify (map nodes never move)
  };
  // What a row must be, given this cache: kContinue when the request is known and `len` is its
  // length plus num_new, else a (re)start.
  RowKind classify(Row& row, size_t len, long long num_new) {
    auto it = reqs_.find(row.key);
    if (it == reqs_.end()) return kStart;
    const size_t have = it->second.local->seq(it->second.seq).tok.size() - it->second.ahead.size();
    if (num_new < 0 || have + size_t(num_new) != len) return kRestart;
    row.req = &it->second;
    return kContinue;
  }
  void step(const std::vector<Row>& rows, std::vector<Draft>& out, spec_plugins::WorkerPool* pool,
            size_t parallel_from, double price = 0.0) {
    const size_t n = rows.size();
    out.resize(n);
    const bool shared_appends = o_.cache_active && o_.max_cached > 0;  // appends also extend the global tree
    for (const Row& row : rows) {
      if (row.kind == kContinue) {
        if (shared_appends) append(row.key, row.tok, row.count);
        continue;
      }
      if (row.kind == kRestart) finish(row.key);
      start(row.key, std::vector<i32>(row.tok, row.tok + row.count));
    }
    // Requests are looked up before any thread starts: the map is not touched while they run.
    std::vector<Req*> reqs(n);
    for (size_t i = 0; i < n; ++i) reqs[i] = rows[i].kind == kContinue ? rows[i].req : &get(rows[i].key);
    // Rows in groups: the group's appends interleaved (feed_group), then its drafts. A request's
    // tentative appends (append_ahead) that agree with its new tokens are kept and not fed again.
    const size_t group = group_;
    std::vector<Row> fed(rows);
    auto own = [&](size_t g) {
      const size_t lo = g * group, hi = std::min(n, lo + group);
      if (!shared_appends) {
        for (size_t i = lo; i < hi; ++i) {
          if (rows[i].kind != kContinue || reqs[i]->ahead.empty()) continue;
          const size_t kept = settle(*reqs[i], rows[i].tok, rows[i].count);
          fed[i].tok += kept;
          fed[i].count -= kept;
        }
        feed_group(reqs.data() + lo, fed.data() + lo, hi - lo);
      }
      for (size_t i = lo; i < hi; ++i) speculate_into(*reqs[i], rows[i].max_tokens, price, out[i]);
    };
    const size_t groups = (n + group - 1) / group;
    if (pool == nullptr || n < parallel_from) {
      for (size_t g = 0; g < groups; ++g) own(g);
      return;
    }
    global_.begin_shared_reads();
    try {
      pool->run(groups, 1, own);
    } catch (...) {
      global_.end_shared_reads();
      throw;
    }
    global_.end_shared_reads();
  }

  // Moves the response into the global tree (unless it is already there) and frees the request.
  bool finish(long long key) {
    auto it = reqs_.find(key);
    if (it == reqs_.end()) return false;
    Req& r = it->second;
    settle(r, nullptr, 0);
    if (r.gseq != kNone) {
      owner_.erase(r.gseq);
    } else if (!o_.cache_active && o_.max_cached > 0) {
      const Seq& S = r.local->seq(r.seq);
      const size_t len = S.tok.size() - r.prompt_len;
      if (len > 0) {
        make_room();
        const i32 g = global_.add_seq(len);
        global_.extend(g, S.tok.data() + r.prompt_len, len);
      }
    }
    reqs_.erase(it);
    return true;
  }

  bool has(long long key) const { return reqs_.count(key) != 0; }
  size_t num_active() const { return reqs_.size(); }
  size_t num_cached() const { return global_.num_seqs(); }
  Tree& global() { return global_; }
  Tree& local(long long key) { return *settled(key).local; }

  size_t num_nodes() const {
    size_t n = global_.num_nodes();
    for (const auto& kv : reqs_) n += kv.second.local->num_nodes();
    return n;
  }
  size_t memory_bytes() const {
    size_t b = sizeof(*this) + global_.memory_bytes() + owner_.size() * 32;
    for (const auto& kv : reqs_) b += kv.second.local->memory_bytes() + 64;
    return b;
  }

  void validate() const {
    global_.validate();
    for (const auto& kv : reqs_) kv.second.local->validate();
  }

  // ---- appending drafts ahead -------------------------------------------------------------------
  // While the engine verifies a step's drafts, each request's tree can already take the leading draft
  // tokens (those whose path probability is at least min_prob): tentatively, journaled. The next step
  // keeps the ones that agree with the request's new tokens and takes the rest back (settle), so only
  // what was not guessed is appended while the engine waits. Trees, copiers and drafts end exactly as
  // without it. keys[i] drafted drafts[i] in the last step; not with in-flight caching (the global
  // tree would be written).
  // Requests' trees are independent: from `parallel_from` requests on, `pool` shares them out.
  void append_ahead(const std::vector<long long>& keys, const std::vector<Draft>& drafts, double min_prob,
                    spec_plugins::WorkerPool* pool = nullptr, size_t parallel_from = 1) {
    if (o_.cache_active) throw std::logic_error("append_ahead: not with in-flight caching");
    std::vector<Req*> reqs(keys.size());  // looked up before any thread starts
    for (size_t i = 0; i < keys.size(); ++i) reqs[i] = &get(keys[i]);
    auto one = [&](size_t i) {
      const size_t m = drafts[i].leading_at_least(min_prob);
      if (m > 0) append_ahead(*reqs[i], drafts[i].tokens.data(), m);
    };
    if (pool == nullptr || keys.size() < parallel_from) {
      for (size_t i = 0; i < keys.size(); ++i) one(i);
      return;
    }
    pool->run(keys.size(), 8, one);
  }
  void append_ahead(Req& r, const i32* tok, size_t m) {
    settle(r, nullptr, 0);
    r.local->begin_tentative(r.seq, m);
    r.ahead.assign(tok, tok + m);
    for (size_t i = 0; i < m; ++i) {
      r.ahead_copiers.push_back(r.copier);
      r.local->append_tentative(tok[i]);
      if (o_.copy.on) r.copier.step(r.local->seq(r.seq), o_.copy);
    }
  }
  // Keeps the request's tentative tokens up to the first that differs from tok[0 .. count), takes
  // back the rest; returns how many were kept (tok[0 .. kept) are in the tree).
  size_t settle(Req& r, const i32* tok, size_t count) {
    const size_t m = r.ahead.size();
    if (m == 0) return 0;
    size_t kept = 0;
    while (kept < m && kept < count && r.ahead[kept] == tok[kept]) ++kept;
    r.local->take_back(kept);
    if (kept < m) r.copier = r.ahead_copiers[kept];
    r.ahead.clear();
    r.ahead_copiers.clear();
    return kept;
  }
  size_t pending(long long key) { return get(key).ahead.size(); }

  // Requests whose appends a batched step interleaves (1: none): the drafts are the same whatever it is.
  static constexpr size_t kMaxGroup = 32;
  void set_interleave(long long group) {
    if (group < 1 || group > (long long)kMaxGroup)
      throw std::invalid_argument("interleave: expected 1 to " + std::to_string(kMaxGroup) + " requests");
    group_ = size_t(group);
  }

 private:
  // A step's appends of up to group_ continuing requests (rows[i].tok[0 .. count) to reqs[i]), one
  // suffix step of one request at a time in turns: trees of many requests do not fit in cache, and each
  // step's loads were started a turn earlier (Tree::Appending). Each request's own steps, and its copier
  // after each token, keep their order, so every tree and copier ends as feed() leaves it.
  void feed_group(Req* const* reqs, const Row* rows, size_t m) {
    struct Cursor {
      Req* r;
      const i32* tok;
      size_t left;
      int phase;  // 0: start the next token, 1: probe the next suffix, 2: apply the probed one
      Tree::Appending a;
    };
    Cursor cur[kMaxGroup];
    size_t live = 0;
    for (size_t i = 0; i < m; ++i)
      if (rows[i].kind == kContinue && rows[i].count > 0) cur[live++] = Cursor{reqs[i], rows[i].tok, rows[i].count, 0, {}};
    if (live == 1) return feed(*cur[0].r, cur[0].tok, cur[0].left);
    while (live > 0) {
      for (size_t q = 0; q < live;) {
        Cursor& c = cur[q];
        Tree& tree = *c.r->local;
        if (c.phase == 0) {
          tree.append_begin(c.r->seq, *c.tok, c.a, 1);
          c.phase = 1;
        } else if (c.phase == 2) {
          tree.append_apply(c.a);
          c.phase = 1;
        } else if (!tree.append_done(c.a)) {
          if (tree.append_probe(c.a)) c.phase = 2;
        } else {  // the token is in
          tree.append_end(c.a);
          if (o_.copy.on) c.r->copier.step(tree.seq(c.r->seq), o_.copy);
          ++c.tok;
          c.phase = 0;
          if (--c.left == 0) {  // this request is done: the last one takes its turn
            c = cur[--live];
            continue;
          }
        }
        ++q;
      }
    }
  }

  void feed(Req& r, const i32* tok, size_t n) {
    if (!o_.copy.on) return r.local->extend(r.seq, tok, n);
    for (size_t i = 0; i < n; ++i) {
      r.local->push(r.seq, tok[i]);
      r.copier.step(r.local->seq(r.seq), o_.copy);
    }
  }

  Req& get(long long key) {
    auto it = reqs_.find(key);
    if (it == reqs_.end()) throw std::invalid_argument("unknown request (not started, or finished)");
    return it->second;
  }
  Req& settled(long long key) {  // the request with its tentative tokens taken back (per-request API)
    Req& r = get(key);
    settle(r, nullptr, 0);
    return r;
  }

  void make_room() {  // FIFO: evict the oldest responses until one more fits
    while (global_.num_seqs() > 0 && (long long)global_.num_seqs() >= o_.max_cached) {
      const i32 s = global_.remove_oldest();
      auto it = owner_.find(s);
      if (it != owner_.end()) {  // still generating: it stops feeding the global tree
        reqs_[it->second].gseq = kNone;
        owner_.erase(it);
      }
    }
  }

  CacheOptions o_;
  size_t group_ = 16;  // set_interleave
  Tree global_;
  std::unordered_map<long long, Req> reqs_;  // looked up only, never iterated for decisions
  std::unordered_map<i32, long long> owner_;  // global slot -> in-flight request
};

// ---- validation (tests only) --------------------------------------------------------------------
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
      if (best == kNone || better(c, best, dv)) best = c;
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

}  // namespace suffix_tree
