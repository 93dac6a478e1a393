// Requests: one tree per request plus the global FIFO cache of responses, and the batched step.
//
// A request (start .. finish) owns a per-request tree over its prompt and output (tree.hpp) and a copier
// (copier.hpp); its drafts are the better of the count drafts of its own tree and the global one and of its
// copy draft. The global tree holds the responses of finished requests, at most max_cached of them: the
// oldest is evicted first (FIFO, which is what keeps the tree's references valid). With cache_active a
// response also goes into the global tree while it is generated.
//
// Cache::step is the engine's step for a whole batch: what writes the global tree on this thread, then each
// request's appends and draft, on a worker pool (worker_pool.hpp) from `parallel_from` rows up, the appends of
// a group of requests interleaved so that one tree's memory loads overlap the others' work. Tokens appended
// ahead between steps (ahead.hpp) are settled first.
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../worker_pool.hpp"
#include "ahead.hpp"
#include "copier.hpp"
#include "tree.hpp"

namespace suffix_tree {

// The defaults are the suffix-tree proposer's option defaults (proposer.py; tests/test_suffix_tree.py checks
// that they agree, through the binding's DEFAULTS).
struct CacheOptions {
  i32 max_depth = 24;  // with copy drafts, deeper trees cost more and draft no better
  long long max_cached = 10000;  // 0 disables the global tree
  bool cache_active = false;     // also insert in-flight responses into the global tree
  // Draft all max_tokens tokens: past where the confidence ends, the chosen path or copy goes on (a runner
  // that verifies every slot, vLLM's Model Runner V2, would pad them with the last token otherwise).
  bool fill = false;
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
    Ahead ahead;          // tokens appended tentatively (append_ahead), not yet settled
  };

 public:
  explicit Cache(const CacheOptions& o) : o_(o), global_(o.max_depth) {}

  const CacheOptions& options() const { return o_; }
  void set_fill(bool on) { o_.fill = on; }

  void start(long long key, const std::vector<i32>& prompt) {
    if (reqs_.count(key)) throw std::invalid_argument("request is already started");
    Req r;
    r.local = std::make_unique<Tree>(o_.max_depth);
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

  Draft speculate(long long key, i32 max_tokens) { return speculate(settled(key), max_tokens); }

  Draft speculate(Req& r, i32 max_tokens) {
    Draft best;
    speculate_into(r, max_tokens, best);
    return best;
  }

  // The same into `best`, whose buffers a batched step keeps from one step to the next (no allocation
  // per request and step).
  void speculate_into(Req& r, i32 max_tokens, Draft& best) {
    best.tokens.clear();
    best.probs.clear();
    best.score = 0.0;
    best.match_len = 0;
    best.tree = nullptr;
    best.tokens.reserve(max_tokens);  // one allocation per draft, not one per doubling
    best.probs.reserve(max_tokens);
    r.copied = false;
    r.local->speculate_self(r.seq, max_tokens, o_.spec, best);
    const Seq& S = r.local->seq(r.seq);
    global_.speculate(S.tok.data(), i32(S.tok.size()), max_tokens, o_.spec, best, r.gseq);  // local wins ties
    if (!o_.copy.on) {
      if (o_.fill && best.tree != nullptr) best.tree->continue_path(best, max_tokens);
      return;
    }
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
    // is right less often than its confidence says (CopyParams::disagree_factor). The tokens, the choice and
    // the score stay; the path probabilities (what the policy trims by) say so.
    const double agreement = !best.tokens.empty() && !copy.tokens.empty() && best.tokens[0] != copy.tokens[0]
                                 ? o_.copy.disagree_factor
                                 : 1.0;
    if (r.copied) {
      if (o_.fill && i32(copy.tokens.size()) < max_tokens) {  // the same copy, past copy_min_prob
        CopyParams no_floor = o_.copy;
        no_floor.min_prob = 0.0;
        const double score = copy.score;
        r.copier.draft(S, max_tokens, no_floor, copy);
        copy.score = score;
      }
      if (agreement != 1.0)
        for (double& p : copy.probs) p *= agreement;
      std::swap(best.tokens, copy.tokens);
      std::swap(best.probs, copy.probs);
      best.score = copy.score;
      best.match_len = copy.match_len;
      return;
    }
    if (o_.fill && best.tree != nullptr) best.tree->continue_path(best, max_tokens);
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
            size_t parallel_from) {
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
      for (size_t i = lo; i < hi; ++i) speculate_into(*reqs[i], rows[i].max_tokens, out[i]);
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

  // Test-only, defined in check.hpp: Tree::validate of every tree.
  void validate() const;

  // ---- appending drafts ahead (ahead.hpp) --------------------------------------------------------
  // Each request's leading draft tokens (path probability >= min_prob) go into its tree tentatively; keys[i]
  // drafted drafts[i] in the last step. Not with in-flight caching (the global tree would be written).
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
    r.ahead.append(*r.local, r.seq, r.copier, o_.copy, tok, m);
  }
  // Keeps the request's tentative tokens that agree with tok[0 .. count) and takes back the rest (Ahead::settle);
  // returns how many were kept.
  size_t settle(Req& r, const i32* tok, size_t count) { return r.ahead.settle(*r.local, r.copier, tok, count); }
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

}  // namespace suffix_tree
