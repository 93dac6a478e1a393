// The per-step column work of the drafting contract (core.py, slots.py), each in one call: it runs on
// every engine step, where a numpy call per check costs more than the check itself (about a microsecond
// each, dozens per step at batch 1).
//   check_batch    DraftBatch's value checks on its int64 columns
//   draft_lengths  BatchDrafts' offsets checked, and each draft's length
//   draft_lists    a step's drafts as Python lists of ints (what engines take)
//   cut_drafts     which tokens BatchDrafts.truncated keeps
//   lookup_slots   RequestSlots' id -> slot lookup of a whole step
//   ledger_seen, ledger_reports, first_over: the drafting layer's ledger and cap check (drafting.py)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace {

using i64 = py::array_t<std::int64_t, py::array::c_style>;

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
  if (tokens.dtype().is(py::dtype::of<std::int32_t>()))
    return lists_of(static_cast<const std::int32_t*>(tokens.data()), o, n);
  if (tokens.dtype().is(py::dtype::of<std::int64_t>()))
    return lists_of(static_cast<const std::int64_t*>(tokens.data()), o, n);
  return lists_of(py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>(tokens).data(), o, n);
}

// (slots, any unknown): each id's slot in `index` (a dict id -> int), -1 where it has none.
py::tuple lookup_slots(py::dict index, py::sequence req_ids) {
  py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(req_ids.ptr(), "req_ids: expected a sequence"));
  if (!seq) throw py::error_already_set();
  const py::ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  i64 out(n);
  std::int64_t* s = out.mutable_data();
  bool unknown = false;
  for (py::ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyDict_GetItemWithError(index.ptr(), items[i]);  // borrowed
    if (v) {
      s[i] = PyLong_AsLongLong(v);
    } else {
      if (PyErr_Occurred()) throw py::error_already_set();  // an unhashable id
      s[i] = -1;
      unknown = true;
    }
  }
  return py::make_tuple(out, unknown);
}

// A step's requests at `slots` were seen at `step` with contexts of `lens`: returns the tokens new since
// each was last seen (num_new where the engine knows it, else the context's growth; the whole context
// for a request seen the first time or whose context shrank), and records lens as seen.
i64 ledger_seen(i64 slots, py::array_t<bool, py::array::c_style> fresh, long long step, i64 lens, py::object num_new_obj,
                i64 last_step, i64 seen_len) {
  const py::ssize_t n = slots.size(), capacity = last_step.size();
  if (fresh.size() != n || lens.size() != n || seen_len.size() != capacity)
    throw py::value_error("ledger: columns of different lengths");
  const bool given = !num_new_obj.is_none();
  i64 num_new;
  if (given) {
    num_new = num_new_obj.cast<i64>();
    if (num_new.size() != n) throw py::value_error("num_new: expected one count per request");
  }
  const std::int64_t* sl = slots.data();
  const bool* is_new = fresh.data();
  const std::int64_t* len = lens.data();
  std::int64_t* last = last_step.mutable_data();
  std::int64_t* seen = seen_len.mutable_data();
  i64 out(n);
  std::int64_t* grown = out.mutable_data();
  for (py::ssize_t i = 0; i < n; ++i) {
    if (sl[i] < 0 || sl[i] >= capacity) throw py::value_error("ledger: slot out of range");
    last[sl[i]] = step;
    const std::int64_t g = given ? num_new.data()[i] : len[i] - seen[sl[i]];
    grown[i] = (is_new[i] || g < 0 || g > len[i]) ? len[i] : g;
    seen[sl[i]] = len[i];
  }
  return out;
}

// Verification results of the requests at `slots` (accepted: drafted tokens accepted in each one's last
// verification, -1 where it is still pending): (rows, drafted, accepted) of the drafts to report, rows
// into slots, accepted capped at what was drafted (a pad or a lucky token past the draft can "match");
// their drafted entries are reset, so each draft is reported once.
py::tuple ledger_reports(i64 slots, i64 accepted, i64 drafted_col) {
  const py::ssize_t n = slots.size(), capacity = drafted_col.size();
  if (accepted.size() != n) throw py::value_error("accepted: expected one count per request");
  const std::int64_t* sl = slots.data();
  const std::int64_t* acc = accepted.data();
  std::int64_t* drafted = drafted_col.mutable_data();
  py::ssize_t m = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    if (sl[i] < 0 || sl[i] >= capacity) throw py::value_error("ledger: slot out of range");
    m += drafted[sl[i]] > 0 && acc[i] >= 0;
  }
  i64 rows(m), d(m), a(m);
  std::int64_t* r = rows.mutable_data();
  std::int64_t* dd = d.mutable_data();
  std::int64_t* aa = a.mutable_data();
  py::ssize_t k = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    std::int64_t& dr = drafted[sl[i]];
    if (dr <= 0 || acc[i] < 0) continue;
    r[k] = i;
    dd[k] = dr;
    aa[k] = acc[i] < dr ? acc[i] : dr;
    dr = 0;
    ++k;
  }
  return py::make_tuple(rows, d, a);
}

// The first row whose draft is longer than its cap, or -1.
long long first_over(i64 lengths, i64 caps) {
  if (lengths.size() != caps.size()) throw py::value_error("drafts: one cap per draft");
  const std::int64_t* l = lengths.data();
  const std::int64_t* c = caps.data();
  for (py::ssize_t i = 0; i < lengths.size(); ++i)
    if (l[i] > c[i]) return i;
  return -1;
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

PYBIND11_MODULE(_columns, m) {
  m.doc() = "The drafting contract's per-step column checks and conversions (core.py, slots.py).";
  m.def("check_batch", &check_batch);
  m.def("draft_lengths", &draft_lengths);
  m.def("draft_lists", &draft_lists);
  m.def("lookup_slots", &lookup_slots);
  m.def("ledger_seen", &ledger_seen);
  m.def("ledger_reports", &ledger_reports);
  m.def("first_over", &first_over);
  m.def("cut_drafts", &cut_drafts);
}
