// Test-only bindings of the suffix-tree core, a module of their own (setup.py) so that the engine's core
// (_core.cpp) carries none of it: the tree on its own (SuffixTree: property tests against a brute-force
// oracle, experiments), and the invariant checks and canonical form of a SuffixCache's trees (check.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>
#include <vector>

#include "binding.hpp"
#include "cache.hpp"
#include "check.hpp"

namespace py = pybind11;
using namespace suffix_tree;
using namespace suffix_tree::binding;

namespace {

// The tree on its own, for tests and experiments: sequences are added, grown, and evicted oldest first.
class PyTree {
 public:
  explicit PyTree(long long max_depth) : tree_(check_depth(max_depth)) {}

  int add(py::handle tokens) {
    read_tokens(tokens, buf_, "tokens");
    const i32 s = tree_.add_seq(buf_.size());
    tree_.extend(s, buf_.data(), buf_.size());
    return s;
  }
  void extend(int s, py::handle tokens) {
    if (s < 0 || !alive(s)) throw py::value_error("extend: no such sequence");
    read_tokens(tokens, buf_, "tokens");
    tree_.extend(s, buf_.data(), buf_.size());
  }
  int remove_oldest() {
    if (tree_.num_seqs() == 0) throw py::value_error("remove_oldest: the tree is empty");
    return tree_.remove_oldest();
  }
  long long count(py::handle pattern) {
    read_tokens(pattern, buf_, "pattern");
    return tree_.count(buf_.data(), i32(buf_.size()));
  }
  py::tuple repeat(int s) {  // (length, next position of the most recent and of the oldest occurrence)
    if (s < 0 || !alive(s)) throw py::value_error("repeat: no such sequence");
    const Seq& S = tree_.seq(s);
    return py::make_tuple(S.rep_len, S.rep_seq, S.rep_next, S.rep_first);
  }
  py::tuple speculate(py::handle context, long long max_tokens, double factor, double offset, double min_prob) {
    read_tokens(context, buf_, "context");
    const SpecParams sp = check_params(factor, offset, min_prob);
    Draft d;
    tree_.speculate(buf_.data(), i32(buf_.size()), check_max_tokens(max_tokens), sp, d);
    return to_python(d);
  }
  Tree tree_;

 private:
  bool alive(int s) { return tree_.is_live(s); }
  std::vector<i32> buf_;
};
// The C++ cache of a _core.SuffixCache (after its last step's tentative appends).
Cache& cache_of(py::handle core) {
  py::object capsule = core.attr("_cache")();
  void* cache = PyCapsule_GetPointer(capsule.ptr(), kCacheCapsule);
  if (cache == nullptr) throw py::error_already_set();
  return *static_cast<Cache*>(cache);
}

py::array_t<long long> canonical(py::handle core, long long key) {
  Cache& cache = cache_of(core);
  if (!cache.has(key)) throw py::value_error("canonical: request " + std::to_string(key) + " is not active");
  const std::vector<long long> c = cache.local(key).canonical();
  py::array_t<long long> out(c.size());
  std::copy(c.begin(), c.end(), out.mutable_data());
  return out;
}

}  // namespace

PYBIND11_MODULE(_testing, m) {
  m.doc() = "Test-only: the suffix tree on its own and the checks of a SuffixCache's trees (see check.hpp).";

  const CacheOptions d;  // the proposer's defaults
  py::class_<PyTree>(m, "SuffixTree")
      .def(py::init<long long>(), py::arg("max_depth") = d.max_depth)
      .def("add", &PyTree::add, py::arg("tokens"), "Add a sequence (the youngest); returns its handle.")
      .def("extend", &PyTree::extend, py::arg("seq"), py::arg("tokens"))
      .def("remove_oldest", &PyTree::remove_oldest, "Evict the oldest sequence; returns its handle.")
      .def("count", &PyTree::count, py::arg("pattern"), "Occurrences of pattern (0 if longer than max_depth).")
      .def("speculate", &PyTree::speculate, py::arg("context"), py::arg("max_tokens"),
           py::arg("max_spec_factor") = d.spec.factor, py::arg("max_spec_offset") = d.spec.offset,
           py::arg("min_token_prob") = d.spec.min_prob,
           "(tokens, probs, score, match_len) of the best draft continuing context.")
      .def_property_readonly("max_depth", [](PyTree& t) { return t.tree_.max_depth(); })
      .def_property_readonly("num_seqs", [](PyTree& t) { return t.tree_.num_seqs(); })
      .def_property_readonly("num_nodes", [](PyTree& t) { return t.tree_.num_nodes(); })
      .def_property_readonly("memory_bytes", [](PyTree& t) { return t.tree_.memory_bytes(); })
      .def("repeat", &PyTree::repeat, py::arg("seq"),
           "(length, seq, next, first) of the longest tail that occurred before, as of the last append")
      .def("check", [](PyTree& t) { t.tree_.validate(); }, "Raise RuntimeError naming a broken invariant.");

  m.def("check", [](py::handle core) { cache_of(core).validate(); }, py::arg("cache"),
        "Check every tree of a _core.SuffixCache; raise RuntimeError naming a broken invariant.");
  m.def("canonical", &canonical, py::arg("cache"), py::arg("key"),
        "A request's tree in a _core.SuffixCache, independent of node ids (Tree::canonical).");
}
