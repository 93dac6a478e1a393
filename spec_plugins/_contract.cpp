// The drafting contract's per-step column checks and conversions (core.py's DraftBatch and BatchDrafts, the
// cost model's count of drafted tokens), each in one call: they run on every engine step, where a numpy call
// per check costs more than the check itself (about a microsecond each, dozens per step at batch 1).
//   check_batch    DraftBatch's value checks on its int64 columns
//   batch_columns  DraftBatch's columns taken as they are when they already are int64 vectors
//   draft_lengths  BatchDrafts' offsets checked, and each draft's length
//   draft_lists    a step's drafts as Python lists of ints (what engines take)
//   cut_drafts     which tokens BatchDrafts.truncated keeps
//   count_and_sum  drafting requests and drafted tokens of a step, for the cost model (policy/cost.py)

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "fast_array.hpp"

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace {

using spec_plugins::usable_as_is;
using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style>;

void check_batch(i64 context_lens, i64 num_new, i64 max_draft, py::object rows_obj, long long height, long long width) {
  const py::ssize_t n = context_lens.size();
  if (num_new.size() != n || max_draft.size() != n) throw py::value_error("DraftBatch: columns of different lengths");
  const std::int64_t* lens = context_lens.data();
  const std::int64_t* fresh = num_new.data();
  const std::int64_t* caps = max_draft.data();
  for (py::ssize_t i = 0; i < n; ++i) {
    if (lens[i] < 0) throw py::value_error("DraftBatch.context_lens: expected integers >= 0");
    if (fresh[i] < 0) throw py::value_error("DraftBatch.num_new: expected integers >= 0");
    if (caps[i] < 0) throw py::value_error("DraftBatch.max_draft: expected integers >= 0");
  }
  for (py::ssize_t i = 0; i < n; ++i)
    if (fresh[i] > lens[i])
      throw py::value_error("DraftBatch.num_new: row " + std::to_string(i) + " has " + std::to_string(fresh[i]) +
                            " new tokens in a context of " + std::to_string(lens[i]));
  if (rows_obj.is_none()) return;
  const i64 rows = rows_obj.cast<i64>();
  if (rows.size() != n) throw py::value_error("DraftBatch.rows: expected one row index per request into a 2-D token matrix");
  const std::int64_t* r = rows.data();
  for (py::ssize_t i = 0; i < n; ++i)
    if (r[i] < 0 || r[i] >= height || lens[i] > width)
      throw py::value_error("DraftBatch.rows: a row or a length falls outside the token matrix");
}

i64 draft_lengths(i64 offsets, long long num_tokens) {
  const py::ssize_t m = offsets.size();
  const std::int64_t* o = offsets.data();
  if (offsets.ndim() != 1 || m == 0 || o[0] != 0 || o[m - 1] != num_tokens)
    throw py::value_error("BatchDrafts.offsets: expected 0, non-decreasing, ending at len(tokens)");
  i64 out(m - 1);
  std::int64_t* len = out.mutable_data();
  for (py::ssize_t i = 0; i + 1 < m; ++i) {
    len[i] = o[i + 1] - o[i];
    if (len[i] < 0) throw py::value_error("BatchDrafts.offsets: expected 0, non-decreasing, ending at len(tokens)");
  }
  return out;
}

template <class T>
py::list lists_of(const T* tok, const std::int64_t* o, py::ssize_t n) {
  py::list out(n);
  for (py::ssize_t i = 0; i < n; ++i) {
    PyObject* row = PyList_New(o[i + 1] - o[i]);
    if (!row) throw py::error_already_set();
    for (std::int64_t j = o[i]; j < o[i + 1]; ++j) {
      PyObject* v = PyLong_FromLongLong(static_cast<long long>(tok[j]));
      if (!v) {
        Py_DECREF(row);
        throw py::error_already_set();
      }
      PyList_SET_ITEM(row, j - o[i], v);
    }
    PyList_SET_ITEM(out.ptr(), i, row);
  }
  return out;
}

py::list draft_lists(py::array tokens, i64 offsets) {
  const py::ssize_t n = offsets.size() - 1;
  const std::int64_t* o = offsets.data();
  if (n < 0 || o[n] > tokens.size() || tokens.ndim() != 1 || !(tokens.flags() & py::array::c_style))
    throw py::value_error("BatchDrafts: offsets outside the tokens");
  if (usable_as_is<std::int32_t, py::array::c_style>(tokens))
    return lists_of(static_cast<const std::int32_t*>(tokens.data()), o, n);
  if (usable_as_is<std::int64_t, py::array::c_style>(tokens))
    return lists_of(static_cast<const std::int64_t*>(tokens.data()), o, n);
  return lists_of(py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>(tokens).data(), o, n);
}

bool is_int64_vector(const py::handle& col, py::ssize_t n) {
  return static_cast<bool>(spec_plugins::vector_as_is<std::int64_t>(col, n));
}

// DraftBatch's three count columns (and rows) when each already is a contiguous int64 vector of n entries:
// checked as check_batch does and returned as they are. False when some column needs converting first.
bool batch_columns(py::ssize_t n, py::handle context_lens, py::handle num_new, py::handle max_draft,
                   py::object rows, long long height, long long width) {
  if (!is_int64_vector(context_lens, n) || !is_int64_vector(num_new, n) || !is_int64_vector(max_draft, n) ||
      (!rows.is_none() && !is_int64_vector(rows, n)))
    return false;
  check_batch(py::reinterpret_borrow<i64>(context_lens), py::reinterpret_borrow<i64>(num_new),
              py::reinterpret_borrow<i64>(max_draft), rows, height, width);
  return true;
}

// (entries that are not 0, their sum): how many requests draft and how many tokens, for the cost model.
py::tuple count_and_sum(i64 lengths) {
  const std::int64_t* l = lengths.data();
  long long nonzero = 0, total = 0;
  for (py::ssize_t i = 0; i < lengths.size(); ++i) {
    nonzero += l[i] != 0;
    total += l[i];
  }
  return py::make_tuple(nonzero, total);
}

// BatchDrafts.truncated: each draft's first keep[i] tokens (never more than it has). None when that keeps
// every draft whole; else (index into the flat tokens, the new offsets).
py::object cut_drafts(i64 offsets, i64 keep) {
  const py::ssize_t n = keep.size();
  if (offsets.size() != n + 1) throw py::value_error("BatchDrafts.truncated: expected one length per draft");
  const std::int64_t* o = offsets.data();
  const std::int64_t* k = keep.data();
  bool whole = true;
  std::int64_t total = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    if (k[i] < 0) throw py::value_error("policy: a trim length must be an integer >= 0");
    const std::int64_t len = o[i + 1] - o[i];
    whole = whole && k[i] >= len;
    total += k[i] < len ? k[i] : len;
  }
  if (whole) return py::none();
  i64 index(total), out(n + 1);
  std::int64_t* idx = index.mutable_data();
  std::int64_t* no = out.mutable_data();
  no[0] = 0;
  std::int64_t at = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t len = o[i + 1] - o[i], kept = k[i] < len ? k[i] : len;
    for (std::int64_t j = 0; j < kept; ++j) idx[at++] = o[i] + j;
    no[i + 1] = at;
  }
  return py::make_tuple(index, out);
}

}  // namespace

PYBIND11_MODULE(_contract, m) {
  m.doc() = "The drafting contract's per-step column checks and conversions (core.py, policy/cost.py).";
  m.def("check_batch", &check_batch);
  m.def("batch_columns", &batch_columns);
  m.def("draft_lengths", &draft_lengths);
  m.def("draft_lists", &draft_lists);
  m.def("cut_drafts", &cut_drafts);
  m.def("count_and_sum", &count_and_sum);
}
