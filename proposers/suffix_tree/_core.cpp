// Python binding of the suffix-tree core the proposer runs (cache.hpp): SuffixCache, the requests' trees,
// the global tree and the batched step. Token ids arrive as lists, tuples or 1-D integer numpy arrays and are
// validated (integers in [0, 2^31)) before any state changes (binding.hpp). The tree on its own and the
// invariant checks are in the test-only module (_testing.cpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../spec_plugins/copy_hazard.hpp"
#include "../../spec_plugins/fast_array.hpp"
#include "binding.hpp"
#include "cache.hpp"

namespace py = pybind11;
using namespace suffix_tree;
using namespace suffix_tree::binding;

namespace {

// A 1-D int64 column (converting other integer dtypes), of length n unless n is -1.
py::array_t<long long> int64_column(py::handle obj, const char* what, long long n = -1) {
  if (auto as_is = spec_plugins::vector_as_is<long long>(obj, n)) return as_is;  // the usual column
  py::array arr = py::array::ensure(obj);
  if (!arr || arr.ndim() != 1 || (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
    throw py::value_error(std::string(what) + ": expected a 1-D integer array");
  if (n >= 0 && arr.shape(0) != n)
    throw py::value_error(std::string(what) + ": expected " + std::to_string(n) + " entries, got " +
                          std::to_string(arr.shape(0)));
  return py::array_t<long long, py::array::c_style | py::array::forcecast>::ensure(arr);
}

CopyParams check_copy(bool on, double min_prob, long long window, long long near_len, long long anchor_run,
                      long long oldest_from, double near_bonus, double near_first_bonus, double hazard_c,
                      double hazard_d, double disagree_factor) {
  auto share = [](const char* what, double v) {
    if (!(v >= 0 && v <= 1)) throw py::value_error(std::string(what) + ": expected a value in [0, 1]");
    return v;
  };
  auto count = [](const char* what, long long v) {
    if (v < 0 || v > 1000000) throw py::value_error(std::string(what) + ": expected an integer in [0, 10**6]");
    return i32(v);
  };
  auto finite = [](const char* what, double v) {
    if (!std::isfinite(v) || v < 0) throw py::value_error(std::string(what) + ": expected a finite value >= 0");
    return v;
  };
  CopyParams cp;
  cp.on = on;
  cp.min_prob = share("copy_min_prob", min_prob);
  cp.window = count("copy_window", window);
  cp.near_len = count("copy_near_len", near_len);
  cp.anchor_run = count("copy_anchor_run", anchor_run);
  cp.oldest_from = count("copy_oldest_from", oldest_from);
  cp.near_bonus = finite("copy_near_bonus", near_bonus);
  cp.near_first_bonus = finite("copy_near_first_bonus", near_first_bonus);
  cp.disagree_factor = share("copy_disagree_factor", disagree_factor);
  cp.hazard_c = finite("copy_hazard_c", hazard_c);
  cp.hazard_d = finite("copy_hazard_d", hazard_d);
  return cp;
}

class PyCache {
 public:
  PyCache(long long max_depth, long long max_cached, bool cache_active, double factor, double offset,
          double min_prob, const CopyParams& copy)
      : cache_(make_options(max_depth, max_cached, cache_active, factor, offset, min_prob, copy)) {}

  void start(long long key, py::handle prompt) {
    quiet();
    if (cache_.has(key)) throw py::value_error("start: request " + std::to_string(key) + " is already started");
    read_tokens(prompt, buf_, "prompt");
    cache_.start(key, buf_);
  }
  void append(long long key, py::handle tokens) {
    quiet();
    require(key, "append");
    read_tokens(tokens, buf_, "tokens");
    cache_.append(key, buf_.data(), buf_.size());
  }
  // The request's whole context `tokens` has grown by num_new: append the tail and draft.
  py::tuple sync_speculate(long long key, py::handle tokens, long long num_new, long long max_tokens) {
    quiet();
    require(key, "propose");
    const i32 m = check_max_tokens(max_tokens);
    const long long have = (long long)cache_.length(key);
    const Py_ssize_t n = PyObject_Length(tokens.ptr());
    if (n < 0) {
      PyErr_Clear();
      throw py::value_error("tokens: expected a sequence of token ids");
    }
    if (num_new < 0 || (long long)n != have + num_new)
      throw py::value_error("context has " + std::to_string(n) + " tokens, expected " + std::to_string(have) +
                            " seen before + num_new=" + std::to_string(num_new));
    read_tokens(tokens, buf_, "tokens", Py_ssize_t(have));
    cache_.append(key, buf_.data(), buf_.size());
    return to_python(cache_.speculate(key, m));
  }
  py::tuple speculate(long long key, long long max_tokens) {
    quiet();
    require(key, "speculate");
    return to_python(cache_.speculate(key, check_max_tokens(max_tokens)));
  }
  // The batched step (Cache::step): one call for the whole batch, drafting with the GIL released.
  //   keys:       int64 [B], distinct
  //   contexts:   a 2-D integer matrix whose row rows[i] holds request i's context (vLLM's token_ids_cpu),
  //               or, with rows=None, a sequence of B token sequences
  //   lens, num_new, max_tokens: int64 [B]
  // Returns (tokens int32 [T], confidence float64 [T], offsets int64 [B + 1], status int8 [B]): row i's
  // draft is tokens[offsets[i]:offsets[i + 1]], its per-token conditional confidences alike, and
  // status[i] is 0 (continued), 1 (started) or 2 (started over).
  py::tuple step_batch(py::handle keys_obj, py::handle contexts, py::handle rows_obj, py::handle lens_obj,
                       py::handle num_new_obj, py::handle max_tokens_obj) {
    quiet();
    const auto keys = int64_column(keys_obj, "keys");
    const size_t n = size_t(keys.shape(0));
    const auto lens = int64_column(lens_obj, "lens", n);
    const auto num_new = int64_column(num_new_obj, "num_new", n);
    const auto max_tokens = int64_column(max_tokens_obj, "max_tokens", n);
    auto K = keys.unchecked<1>();
    auto L = lens.unchecked<1>();
    auto N = num_new.unchecked<1>();
    auto M = max_tokens.unchecked<1>();

    // Rows of a matrix are read in place when they are int32 and contiguous; anything else is copied.
    py::array matrix;
    py::array_t<long long> rows;
    const bool is_matrix = py::isinstance<py::array>(contexts);
    py::object seqs;
    if (is_matrix) {
      matrix = py::reinterpret_borrow<py::array>(contexts);
      if (matrix.ndim() != 2) throw py::value_error("contexts: expected a 2-D token matrix or a list of sequences");
      if (rows_obj.is_none()) throw py::value_error("rows: required with a token matrix");
      rows = int64_column(rows_obj, "rows", n);
    } else {
      if (!rows_obj.is_none()) throw py::value_error("rows: only with a token matrix");
      seqs = py::reinterpret_steal<py::object>(PySequence_Fast(contexts.ptr(), "contexts: expected a sequence"));
      if (!seqs) throw py::error_already_set();
      if (size_t(PySequence_Fast_GET_SIZE(seqs.ptr())) != n)
        throw py::value_error("contexts: expected " + std::to_string(n) + " sequences");
    }
    const bool direct = is_matrix && matrix.dtype().kind() == 'i' && matrix.itemsize() == 4 &&
                        matrix.strides(1) == 4;
    {  // distinct keys: sorted, neighbours differ
      std::vector<long long> sorted(keys.data(), keys.data() + n);
      std::sort(sorted.begin(), sorted.end());
      const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
      if (twice != sorted.end()) throw py::value_error("keys: key " + std::to_string(*twice) + " appears twice");
    }
    std::vector<Cache::Row> plan(n);
    std::vector<std::vector<i32>> copies(n);
    for (size_t i = 0; i < n; ++i) {
      const long long key = K(i), len = L(i);
      if (len < 0) throw py::value_error("lens: row " + std::to_string(i) + " is negative");
      Cache::Row& row = plan[i];
      row.key = key;
      row.max_tokens = check_max_tokens(M(i));
      row.kind = cache_.classify(row, size_t(len), N(i));
      const size_t from = row.kind == Cache::kContinue ? size_t(len - N(i)) : 0;
      row.count = size_t(len) - from;
      auto what = [i] { return "contexts row " + std::to_string(i); };
      if (is_matrix) {
        const long long r = rows.at(Py_ssize_t(i));
        if (r < 0 || r >= matrix.shape(0)) throw py::value_error("rows: row " + std::to_string(i) + " out of range");
        if (len > matrix.shape(1)) throw py::value_error("lens: row " + std::to_string(i) + " exceeds the matrix");
        if (direct) {
          const auto* base = static_cast<const std::int32_t*>(matrix.data()) + r * (matrix.strides(0) / 4);
          for (size_t j = from; j < size_t(len); ++j)
            if (base[j] < 0) bad_token(what().c_str(), Py_ssize_t(j), std::to_string(base[j]));
          row.tok = base + from;
          continue;
        }
        py::array slice = matrix.attr("__getitem__")(py::make_tuple(r, py::slice(0, len, 1)));
        read_tokens(slice, copies[i], what().c_str(), Py_ssize_t(from));
      } else {
        py::handle seq = PySequence_Fast_GET_ITEM(seqs.ptr(), Py_ssize_t(i));
        const Py_ssize_t got = read_tokens(seq, copies[i], what().c_str(), Py_ssize_t(from));
        if (got != len) throw py::value_error("lens: row " + std::to_string(i) + " is " + std::to_string(len) +
                                              ", its sequence has " + std::to_string(got) + " tokens");
      }
      row.tok = copies[i].data();
    }

    std::vector<Draft>& drafts = drafts_;  // kept between steps: their buffers are reused
    {
      py::gil_scoped_release release;
      if (n >= parallel_from_ && workers_ != 0 && !pool_) pool_ = std::make_unique<spec_plugins::WorkerPool>(workers_);
      cache_.step(plan, drafts, pool_.get(), parallel_from_);
    }

    size_t total = 0;
    for (const Draft& d : drafts) total += d.tokens.size();
    py::array_t<std::int32_t> tokens(total);
    py::array_t<double> confidence(total);
    py::array_t<long long> offsets(n + 1);
    py::array_t<signed char> status(n);
    auto T = tokens.mutable_unchecked<1>();
    auto C = confidence.mutable_unchecked<1>();
    auto O = offsets.mutable_unchecked<1>();
    auto S = status.mutable_unchecked<1>();
    size_t at = 0;
    O(0) = 0;
    for (size_t i = 0; i < n; ++i) {
      const Draft& d = drafts[i];
      double prev = 1.0;  // path probabilities -> per-token conditionals, as Draft.confidence wants
      for (size_t k = 0; k < d.tokens.size(); ++k, ++at) {
        T(at) = d.tokens[k];
        C(at) = prev > 0 ? d.probs[k] / prev : 0.0;
        prev = d.probs[k];
      }
      O(i + 1) = (long long)at;
      S(i) = plan[i].kind;
    }
    if (ahead_ && ahead_tokens(drafts) >= ahead_min_tokens_) {  // the drafts' leading tokens go into the trees
      ahead_keys_.assign(keys.data(), keys.data() + n);          // while the engine verifies them
      if (!background_) background_ = std::make_unique<spec_plugins::Background>();
      // The step's worker pool (if it has one) helps: the next step waits for this before using it.
      background_->post([this] { cache_.append_ahead(ahead_keys_, drafts_, ahead_min_prob_, pool_.get(), parallel_from_); });
    }
    return py::make_tuple(tokens, confidence, offsets, status);
  }
  void set_ahead(bool on, double min_prob, long long min_tokens) {
    quiet();
    if (min_tokens < 0) throw py::value_error("ahead_min_tokens: expected an integer >= 0");
    if (!(min_prob >= 0.0 && min_prob <= 1.0))
      throw py::value_error("ahead_min_prob: expected a value in [0, 1], got " + std::to_string(min_prob));
    if (on && cache_.options().cache_active)
      throw py::value_error("append_ahead: not with cache_in_flight (the global tree would be written between steps)");
    ahead_ = on;
    ahead_min_prob_ = min_prob;
    ahead_min_tokens_ = size_t(min_tokens);
  }
  bool ahead() const { return ahead_; }
  void set_fill(bool on) {
    quiet();
    cache_.set_fill(on);
  }
  bool fills() const { return cache_.options().fill; }
  size_t ahead_tokens(const std::vector<Draft>& drafts) const {
    size_t total = 0;
    for (const Draft& d : drafts) total += d.leading_at_least(ahead_min_prob_);
    return total;
  }
  // Waits for the tentative appends of the last step (they run on their own thread until then).
  void quiet() {
    if (!background_) return;
    py::gil_scoped_release release;
    background_->wait();
  }
  long long pending(long long key) {
    quiet();
    require(key, "pending");
    return (long long)cache_.pending(key);
  }
  // The cache itself, once the last step's tentative appends are done, for the test-only module's checks
  // (_testing.cpp: built from the same headers with the same flags, so it reads the same layout).
  py::capsule cache_capsule() {
    quiet();
    return py::capsule(static_cast<void*>(&cache_), kCacheCapsule);
  }
  void set_parallel(long long workers, long long parallel_from, long long interleave) {
    quiet();
    if (workers < -1 || workers > 256) throw py::value_error("threads: expected -1 (auto), 0 (off) or up to 256");
    if (parallel_from < 1) throw py::value_error("parallel_from: expected an integer >= 1");
    cache_.set_interleave(interleave);
    workers_ = workers < 0 ? spec_plugins::default_workers() : int(workers);
    parallel_from_ = size_t(parallel_from);
    pool_.reset();
  }
  int workers() const { return workers_; }

  bool finish(long long key) {
    quiet();
    return cache_.finish(key);
  }
  long long length(long long key) {
    quiet();
    require(key, "length");
    return (long long)cache_.length(key);
  }
  long long local_count(long long key, py::handle pattern) {
    quiet();
    require(key, "local_count");
    read_tokens(pattern, buf_, "pattern");
    return cache_.local(key).count(buf_.data(), i32(buf_.size()));
  }
  py::tuple copy_state(long long key) {
    quiet();
    require(key, "copy_state");
    const Copier& c = cache_.copier(key);
    return py::make_tuple(c.src(), c.len(), c.anchor(), c.near());
  }
  bool last_draft_copied(long long key) {
    quiet();
    require(key, "last_draft_copied");
    return cache_.copied(key);
  }
  long long global_count(py::handle pattern) {
    quiet();
    read_tokens(pattern, buf_, "pattern");
    return cache_.global().count(buf_.data(), i32(buf_.size()));
  }
  Cache cache_;

 private:
  std::vector<Draft> drafts_;
  static CacheOptions make_options(long long max_depth, long long max_cached, bool cache_active, double factor,
                                   double offset, double min_prob, const CopyParams& copy) {
    if (max_cached < 0 || max_cached > 0x7fffffffLL)
      throw py::value_error("max_cached_requests: expected an integer in [0, 2**31), got " + std::to_string(max_cached));
    CacheOptions o;
    o.max_depth = check_depth(max_depth);
    o.max_cached = max_cached;
    o.cache_active = cache_active;
    o.spec = check_params(factor, offset, min_prob);
    o.copy = copy;
    return o;
  }
  void require(long long key, const char* what) {
    if (!cache_.has(key))
      throw py::value_error(std::string(what) + ": request " + std::to_string(key) + " is not active");
  }
  std::vector<i32> buf_;
  int workers_ = spec_plugins::default_workers();
  size_t parallel_from_ = 64;
  std::unique_ptr<spec_plugins::WorkerPool> pool_;
  bool ahead_ = false;
  double ahead_min_prob_ = 1.0;   // set_ahead: the proposer's ahead_min_prob
  size_t ahead_min_tokens_ = 0;  // and ahead_min_tokens
  std::vector<long long> ahead_keys_;
  // Last: destroyed first, so a task still running finishes before the cache and drafts go.
  std::unique_ptr<spec_plugins::Background> background_;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Depth-limited suffix trees with counts for SuffixDecoding (see cache.hpp).";

  // One definition of the copy reliability h(m) = 1 - c / (m + d), shared with the n-gram proposer.
  m.attr("HAZARD_C") = spec_plugins::kHazardC;
  m.attr("HAZARD_D") = spec_plugins::kHazardD;

  const CacheOptions d;  // the defaults, by the proposer's option names (tests check that the two agree)
  const CopyParams& dc = d.copy;
  py::dict defaults;
  defaults["max_depth"] = d.max_depth;
  defaults["max_cached_requests"] = d.max_cached;
  defaults["cache_in_flight"] = d.cache_active;
  defaults["max_spec_factor"] = d.spec.factor;
  defaults["max_spec_offset"] = d.spec.offset;
  defaults["min_token_prob"] = d.spec.min_prob;
  defaults["copy_drafts"] = dc.on;
  defaults["copy_min_prob"] = dc.min_prob;
  defaults["copy_window"] = dc.window;
  defaults["copy_near_len"] = dc.near_len;
  defaults["copy_anchor_run"] = dc.anchor_run;
  defaults["copy_oldest_from"] = dc.oldest_from;
  defaults["copy_near_bonus"] = dc.near_bonus;
  defaults["copy_near_first_bonus"] = dc.near_first_bonus;
  defaults["copy_hazard_c"] = dc.hazard_c;
  defaults["copy_hazard_d"] = dc.hazard_d;
  defaults["copy_disagree_factor"] = dc.disagree_factor;
  m.attr("DEFAULTS") = defaults;

  py::class_<PyCache>(m, "SuffixCache")
      .def(py::init([](long long max_depth, long long max_cached, bool cache_active, double factor,
                       double offset, double min_prob, bool copy, double copy_min_prob,
                       long long copy_window, long long copy_near_len, long long copy_anchor_run,
                       long long copy_oldest_from, double copy_near_bonus, double copy_near_first_bonus,
                       double copy_hazard_c, double copy_hazard_d, double copy_disagree_factor) {
             return new PyCache(max_depth, max_cached, cache_active, factor, offset, min_prob,
                                check_copy(copy, copy_min_prob, copy_window, copy_near_len, copy_anchor_run,
                                           copy_oldest_from, copy_near_bonus, copy_near_first_bonus, copy_hazard_c,
                                           copy_hazard_d, copy_disagree_factor));
           }),
           py::arg("max_depth") = d.max_depth, py::arg("max_cached_requests") = d.max_cached,
           py::arg("cache_in_flight") = d.cache_active,
           py::arg("max_spec_factor") = d.spec.factor, py::arg("max_spec_offset") = d.spec.offset,
           py::arg("min_token_prob") = d.spec.min_prob, py::arg("copy") = dc.on, py::arg("copy_min_prob") = dc.min_prob,
           py::arg("copy_window") = dc.window, py::arg("copy_near_len") = dc.near_len,
           py::arg("copy_anchor_run") = dc.anchor_run, py::arg("copy_oldest_from") = dc.oldest_from,
           py::arg("copy_near_bonus") = dc.near_bonus, py::arg("copy_near_first_bonus") = dc.near_first_bonus,
           py::arg("copy_hazard_c") = dc.hazard_c,
           py::arg("copy_hazard_d") = dc.hazard_d, py::arg("copy_disagree_factor") = dc.disagree_factor)
      .def("start", &PyCache::start, py::arg("key"), py::arg("prompt"))
      .def("append", &PyCache::append, py::arg("key"), py::arg("tokens"))
      .def("sync_speculate", &PyCache::sync_speculate, py::arg("key"), py::arg("tokens"), py::arg("num_new"),
           py::arg("max_tokens"))
      .def("speculate", &PyCache::speculate, py::arg("key"), py::arg("max_tokens"))
      .def("step_batch", &PyCache::step_batch, py::arg("keys"), py::arg("contexts"), py::arg("rows"),
           py::arg("lens"), py::arg("num_new"), py::arg("max_tokens"))
      .def("set_parallel", &PyCache::set_parallel, py::arg("threads"), py::arg("parallel_from"),
           py::arg("interleave") = 16,
           "Worker threads for batched drafting (-1: one per extra core, at most 7; 0: none), the batch "
           "size from which they are used, and how many requests' appends a batched step interleaves.")
      .def_property_readonly("threads", &PyCache::workers)
      .def("set_ahead", &PyCache::set_ahead, py::arg("on"), py::arg("min_prob"), py::arg("min_tokens"),
           "Append each batched step's leading draft tokens (path probability >= min_prob) to the trees on a "
           "thread of their own until the next call, when the step has at least min_tokens of them; the next "
           "step keeps those its new tokens agree with (the proposer's options ahead_min_prob, ahead_min_tokens).")
      .def_property_readonly("appends_ahead", &PyCache::ahead, "Whether batched steps append drafts ahead.")
      .def("set_fill", &PyCache::set_fill, py::arg("on"),
           "Draft all max_tokens tokens: past where the confidence ends the chosen path (or copy) goes on, its "
           "path probabilities falling (the proposer's option fill).")
      .def_property_readonly("fills", &PyCache::fills, "Whether drafts are filled to max_tokens.")
      .def("wait_ahead", &PyCache::quiet, "Wait for the last step's tentative appends.")
      .def("pending", &PyCache::pending, py::arg("key"), "Tentative tokens of the request not settled yet.")
      .def("_cache", &PyCache::cache_capsule, "The C++ cache, for the test-only module (_testing).")
      .def("finish", &PyCache::finish, py::arg("key"))
      .def("length", &PyCache::length, py::arg("key"))
      .def("local_count", &PyCache::local_count, py::arg("key"), py::arg("pattern"))
      .def("global_count", &PyCache::global_count, py::arg("pattern"))
      .def("_copy_state", &PyCache::copy_state, py::arg("key"), "(source, match length, anchor, near) of the copier")
      .def("last_draft_copied", &PyCache::last_draft_copied, py::arg("key"),
           "Whether the request's last draft was a copy draft (else a count draft, or none)")
      .def_property_readonly("num_active", [](PyCache& c) { c.quiet(); return c.cache_.num_active(); })
      .def_property_readonly("num_cached", [](PyCache& c) { c.quiet(); return c.cache_.num_cached(); })
      .def_property_readonly("num_nodes", [](PyCache& c) { c.quiet(); return c.cache_.num_nodes(); })
      .def_property_readonly("global_nodes", [](PyCache& c) { c.quiet(); return c.cache_.global().num_nodes(); })
      .def_property_readonly("memory_bytes", [](PyCache& c) { c.quiet(); return c.cache_.memory_bytes(); })
      .def_property_readonly("arena_bytes", [](PyCache&) { return spec_plugins::PageArena::held_bytes(); },
                             "Bytes the process holds for the trees' large arrays (every cache's, in use or free).");
}
