// Batched prompt-lookup n-gram drafting (the `ngram` proposer's serving path). Same rule as
// NgramProposer.lookup: the longest n-gram (up to max_ngram tokens) ending the context that occurred
// before, its earliest occurrence, and the tokens that followed it. One call per engine step, the GIL
// released while scanning, rows spread over worker threads from `parallel_from` rows up.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../../spec_plugins/copy_hazard.hpp"
#include "../../spec_plugins/fast_array.hpp"
#include "../worker_pool.hpp"

namespace py = pybind11;

namespace {

struct Found {
  std::int64_t start = 0;  // first drafted position
  std::int64_t len = 0;    // drafted tokens
  std::int64_t match = 0;  // length of the n-gram matched (0: no draft)
};

// Candidate ends are the positions j < n - 1 that match the context's last token and, when min_ngram >= 2,
// the token before it too (a shorter match can never be chosen). Most of the context holds none, so blocks of
// kBlock positions are first tested with one branch-free compare each, which the compiler vectorises; only
// blocks with a hit are walked position by position.
constexpr std::int64_t kBlock = 32;

template <class T>
Found lookup(const T* tok, std::int64_t n, std::int64_t max_draft, std::int64_t min_ngram, std::int64_t max_ngram) {
  Found f;
  if (max_draft <= 0 || n <= min_ngram) return f;
  const std::int64_t longest = std::min(max_ngram, n - 1);
  const T last = tok[n - 1];
  const bool pair = min_ngram >= 2;  // then n >= 3, and candidates also match the token before the last
  const T prev = pair ? tok[n - 2] : last;
  std::int64_t best = 0, best_end = -1;
  const std::int64_t end = n - 1;  // candidate ends j < end
  std::int64_t j = pair ? 1 : 0;
  while (j < end) {
    for (; j + kBlock <= end; j += kBlock) {
      T hits = 0;  // a sum of the type compared: the reduction the vectoriser takes (a bool |= is not)
      if (pair) {
        for (std::int64_t k = 0; k < kBlock; ++k) hits += T(tok[j + k] == last) & T(tok[j + k - 1] == prev);
      } else {
        for (std::int64_t k = 0; k < kBlock; ++k) hits += T(tok[j + k] == last);
      }
      if (hits) break;
    }
    for (const std::int64_t stop = std::min(j + kBlock, end); j < stop; ++j) {
      if (tok[j] != last) continue;
      std::int64_t l = 1;
      while (l < longest && j - l >= 0 && tok[j - l] == tok[n - 1 - l]) ++l;
      if (l > best) {  // strictly longer: the earliest occurrence of each length wins
        best = l;
        best_end = j;
        if (best == longest) goto found;
      }
    }
  }
found:
  if (best < min_ngram || best_end < 0) return f;
  f.start = best_end + 1;
  f.len = std::min(max_draft, n - f.start);
  f.match = f.len > 0 ? best : 0;
  return f;
}

py::array_t<std::int64_t> column(py::handle obj, const char* what, py::ssize_t n) {
  if (auto as_is = spec_plugins::vector_as_is<std::int64_t>(obj, n)) return as_is;  // the usual column
  py::array arr = py::array::ensure(obj);
  if (!arr || arr.ndim() != 1 || (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
    throw py::value_error(std::string(what) + ": expected a 1-D integer array");
  if (n >= 0 && arr.shape(0) != n)
    throw py::value_error(std::string(what) + ": expected " + std::to_string(n) + " entries");
  return py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
}

class Batch {
 public:
  Batch(long long min_ngram, long long max_ngram, long long threads, long long parallel_from)
      : min_(min_ngram), max_(max_ngram) {
    if (min_ngram < 1 || max_ngram < min_ngram)
      throw py::value_error("ngram: expected 1 <= min_ngram <= max_ngram");
    if (threads < -1 || threads > 256) throw py::value_error("threads: expected -1 (auto), 0 (off) or up to 256");
    if (parallel_from < 1) throw py::value_error("parallel_from: expected an integer >= 1");
    workers_ = threads < 0 ? spec_plugins::default_workers() : int(threads);
    parallel_from_ = size_t(parallel_from);
  }

  // (tokens int64 [T], offsets int64 [B + 1]) for a token matrix + rows, or a list of sequences.
  py::tuple propose(py::handle contexts, py::handle rows_obj, py::handle lens_obj, py::handle max_draft_obj) {
    const auto lens = column(lens_obj, "lens", -1);
    const py::ssize_t n = lens.shape(0);
    const auto caps = column(max_draft_obj, "max_draft", n);
    auto L = lens.unchecked<1>();
    auto M = caps.unchecked<1>();
    // Each row as (pointer, element size): matrix rows in place (int32 or int64), sequences copied.
    std::vector<const void*> ptr(n);
    int itemsize = 8;
    std::vector<std::vector<std::int64_t>> copies;
    py::array matrix;
    if (py::isinstance<py::array>(contexts)) {
      matrix = py::reinterpret_borrow<py::array>(contexts);
      if (matrix.ndim() != 2 || matrix.dtype().kind() != 'i' || (matrix.itemsize() != 4 && matrix.itemsize() != 8))
        throw py::value_error("contexts: expected a 2-D int32 or int64 token matrix");
      if (matrix.strides(1) != matrix.itemsize()) matrix = py::array::ensure(matrix, py::array::c_style);
      itemsize = int(matrix.itemsize());
      const auto rows = column(rows_obj, "rows", n);
      auto R = rows.unchecked<1>();
      const char* base = static_cast<const char*>(matrix.data());
      for (py::ssize_t i = 0; i < n; ++i) {
        if (R(i) < 0 || R(i) >= matrix.shape(0) || L(i) < 0 || L(i) > matrix.shape(1))
          throw py::value_error("rows/lens: row " + std::to_string(i) + " falls outside the token matrix");
        ptr[i] = base + R(i) * matrix.strides(0);
      }
    } else {
      py::sequence seqs = py::reinterpret_borrow<py::sequence>(contexts);
      if (py::ssize_t(py::len(seqs)) != n) throw py::value_error("contexts: expected one sequence per row");
      copies.resize(n);
      for (py::ssize_t i = 0; i < n; ++i) {
        auto arr = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(seqs[i]);
        if (!arr || arr.ndim() != 1 || arr.shape(0) != L(i))
          throw py::value_error("contexts: row " + std::to_string(i) + " is not a sequence of lens[i] token ids");
        copies[i].assign(arr.data(), arr.data() + arr.shape(0));
        ptr[i] = copies[i].data();
      }
    }
    std::vector<Found> found(n);
    {
      py::gil_scoped_release release;
      auto one = [&](size_t i) {
        found[i] = itemsize == 4
                       ? lookup(static_cast<const std::int32_t*>(ptr[i]), L(i), M(i), min_, max_)
                       : lookup(static_cast<const std::int64_t*>(ptr[i]), L(i), M(i), min_, max_);
      };
      if (size_t(n) >= parallel_from_ && workers_ > 0) {
        if (!pool_) pool_ = std::make_unique<spec_plugins::WorkerPool>(workers_);
        pool_->run(size_t(n), 8, one);
      } else {
        for (size_t i = 0; i < size_t(n); ++i) one(i);
      }
    }
    py::array_t<std::int64_t> offsets(n + 1);
    auto O = offsets.mutable_unchecked<1>();
    O(0) = 0;
    for (py::ssize_t i = 0; i < n; ++i) O(i + 1) = O(i) + found[i].len;
    py::array_t<std::int64_t> tokens(O(n));
    auto T = tokens.mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < found[i].len; ++k) {
        const std::int64_t at = found[i].start + k;
        T(O(i) + k) = itemsize == 4 ? static_cast<const std::int32_t*>(ptr[i])[at]
                                    : static_cast<const std::int64_t*>(ptr[i])[at];
      }
    py::array_t<std::int64_t> match(n);
    auto Mt = match.mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i) Mt(i) = found[i].match;
    return py::make_tuple(tokens, offsets, match);
  }

 private:
  std::int64_t min_, max_;
  int workers_;
  size_t parallel_from_;
  std::unique_ptr<spec_plugins::WorkerPool> pool_;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Batched prompt-lookup n-gram drafting (see proposers/ngram/proposer.py).";
  // The reliability of a draft after m matched tokens, h(m) = 1 - c / (m + d): proposer.py's confidences, with
  // the suffix tree's constants (one definition: spec_plugins/copy_hazard.hpp).
  m.attr("HAZARD_C") = spec_plugins::kHazardC;
  m.attr("HAZARD_D") = spec_plugins::kHazardD;
  py::class_<Batch>(m, "NgramBatch")
      .def(py::init<long long, long long, long long, long long>(), py::arg("min_ngram"), py::arg("max_ngram"),
           py::arg("threads") = -1, py::arg("parallel_from") = 64)
      .def("propose", &Batch::propose, py::arg("contexts"), py::arg("rows"), py::arg("lens"), py::arg("max_draft"));
}
