// The per-step column work of the drafting contract (core.py, slots.py), each in one call: it runs on
// every engine step, where a numpy call per check costs more than the check itself (about a microsecond
// each, dozens per step at batch 1).
//   check_batch    DraftBatch's value checks on its int64 columns
//   draft_lengths  BatchDrafts' offsets checked, and each draft's length
//   draft_lists    a step's drafts as Python lists of ints (what engines take)
//   cut_drafts     which tokens BatchDrafts.truncated keeps
//   lookup_slots   RequestSlots' id -> slot lookup of a whole step
//   ledger_seen, ledger_reports, first_over: the drafting layer's ledger and cap check (drafting.py)
//   ledger_step    the ledger's whole step when every request is known: lookup, reports, seen (drafting.py)
//   batch_columns  DraftBatch's columns taken as they are when they already are int64 vectors
//   vllm_rows      what vLLM's runner hands a custom_class proposer, as the layer's columns (vllm/proposer.py)
//   count_and_sum  drafting requests and drafted tokens of a step, for the cost model (policy/cost.py)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "fast_array.hpp"

#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

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

// Each of ids[0..n)'s slot in `index` (a dict id -> int) into s, -1 where it has none; returns whether some
// id has none. With stop_at_unknown, returns at the first such id (s is then incomplete).
bool find_slots(const py::dict& index, PyObject** ids, py::ssize_t n, std::int64_t* s, bool stop_at_unknown) {
  bool unknown = false;
  for (py::ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyDict_GetItemWithError(index.ptr(), ids[i]);  // borrowed
    if (v) {
      s[i] = PyLong_AsLongLong(v);
    } else {
      if (PyErr_Occurred()) throw py::error_already_set();  // an unhashable id
      s[i] = -1;
      unknown = true;
      if (stop_at_unknown) return true;
    }
  }
  return unknown;
}

// (slots, any unknown): each id's slot in `index` (a dict id -> int), -1 where it has none.
py::tuple lookup_slots(py::dict index, py::sequence req_ids) {
  py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(req_ids.ptr(), "req_ids: expected a sequence"));
  if (!seq) throw py::error_already_set();
  const py::ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  i64 out(n);
  const bool unknown = find_slots(index, PySequence_Fast_ITEMS(seq.ptr()), n, out.mutable_data(), false);
  return py::make_tuple(out, unknown);
}

// An optional per-request count column (None: nullptr); `keep` holds the array while the pointer is used.
const std::int64_t* optional_counts(const py::object& obj, py::ssize_t n, const char* what, i64& keep) {
  if (obj.is_none()) return nullptr;
  keep = obj.cast<i64>();
  if (keep.size() != n) throw py::value_error(std::string(what) + ": expected one count per request");
  return keep.data();
}

// Slots index columns of `capacity` rows.
void check_slots(const std::int64_t* sl, py::ssize_t n, py::ssize_t capacity) {
  for (py::ssize_t i = 0; i < n; ++i)
    if (sl[i] < 0 || sl[i] >= capacity) throw py::value_error("ledger: slot out of range");
}

// Records the requests at sl[0..n) as seen at `step` with contexts of len[i] and writes the tokens new since
// each was last seen into grown: fresh[i] where the engine knows it (fresh not null), else the context's
// growth; the whole context for a request seen the first time (is_new[i], when is_new is not null) or whose
// context shrank. Slots must be in range.
void record_seen(const std::int64_t* sl, py::ssize_t n, const bool* is_new, long long step, const std::int64_t* len,
                 const std::int64_t* fresh, std::int64_t* last, std::int64_t* seen, std::int64_t* grown) {
  for (py::ssize_t i = 0; i < n; ++i) {
    last[sl[i]] = step;
    const std::int64_t g = fresh ? fresh[i] : len[i] - seen[sl[i]];
    grown[i] = ((is_new && is_new[i]) || g < 0 || g > len[i]) ? len[i] : g;
    seen[sl[i]] = len[i];
  }
}

// A step's requests at `slots` were seen at `step` with contexts of `lens`: returns the tokens new since
// each was last seen (num_new where the engine knows it, else the context's growth; the whole context
// for a request seen the first time or whose context shrank), and records lens as seen.
i64 ledger_seen(i64 slots, spec_plugins::CArray<bool, py::array::c_style> fresh, long long step, i64 lens,
                py::object num_new_obj, i64 last_step, i64 seen_len) {
  const py::ssize_t n = slots.size(), capacity = last_step.size();
  if (fresh.size() != n || lens.size() != n || seen_len.size() != capacity)
    throw py::value_error("ledger: columns of different lengths");
  i64 num_new;
  const std::int64_t* given = optional_counts(num_new_obj, n, "num_new", num_new);
  const std::int64_t* sl = slots.data();
  check_slots(sl, n, capacity);
  i64 out(n);
  record_seen(sl, n, fresh.data(), step, lens.data(), given, last_step.mutable_data(), seen_len.mutable_data(),
              out.mutable_data());
  return out;
}

// Verification reports of the requests at `slots` into (r, dd, aa) (see ledger_reports); returns how many.
py::ssize_t take_reports(const std::int64_t* sl, const std::int64_t* acc, py::ssize_t n, std::int64_t* drafted,
                         std::int64_t* r, std::int64_t* dd, std::int64_t* aa) {
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
  return k;
}

// The reported requests' ids (items[r[k]], the same objects) and the first m drafted and accepted counts as
// int64 arrays: (ids, drafted, accepted), what the policy's observe_batch takes.
py::tuple reports_of(PyObject** items, const std::vector<std::int64_t>& r, const std::vector<std::int64_t>& dd,
                     const std::vector<std::int64_t>& aa, py::ssize_t m) {
  py::list ids(m);
  for (py::ssize_t k = 0; k < m; ++k) PyList_SET_ITEM(ids.ptr(), k, py::handle(items[r[k]]).inc_ref().ptr());
  i64 d(m), a(m);
  std::copy(dd.begin(), dd.begin() + m, d.mutable_data());
  std::copy(aa.begin(), aa.begin() + m, a.mutable_data());
  return py::make_tuple(ids, d, a);
}

// Verification results of the requests `req_ids` at `slots` (accepted: drafted tokens accepted in each one's
// last verification, -1 where it is still pending): (ids, drafted, accepted) of the drafts to report,
// accepted capped at what was drafted (a pad or a lucky token past the draft can "match"); their drafted
// entries are reset, so each draft is reported once.
py::tuple ledger_reports(py::sequence req_ids, i64 slots, i64 accepted, i64 drafted_col) {
  py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(req_ids.ptr(), "req_ids: expected a sequence"));
  if (!seq) throw py::error_already_set();
  const py::ssize_t n = slots.size(), capacity = drafted_col.size();
  if (PySequence_Fast_GET_SIZE(seq.ptr()) != n) throw py::value_error("req_ids: expected one id per slot");
  if (accepted.size() != n) throw py::value_error("accepted: expected one count per request");
  const std::int64_t* sl = slots.data();
  check_slots(sl, n, capacity);
  std::vector<std::int64_t> r(n), dd(n), aa(n);
  const py::ssize_t m = take_reports(sl, accepted.data(), n, drafted_col.mutable_data(), r.data(), dd.data(), aa.data());
  return reports_of(PySequence_Fast_ITEMS(seq.ptr()), r, dd, aa, m);
}

// The ledger's step in one call when every id is already in `index` (the usual engine step): None, with
// nothing written, if some id is unknown (the caller takes the general path, which creates slots). Else
// (slots, grown, reports): what lookup_slots, ledger_reports (accepted given; reports is None otherwise)
// and ledger_seen (no request new) return, in the same order of effects. A repeated id raises before any
// column is written.
py::object ledger_step(py::dict index, py::sequence req_ids, long long step, i64 lens, py::object num_new_obj,
                       py::object accepted_obj, i64 last_step, i64 seen_len, i64 drafted_col) {
  py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(req_ids.ptr(), "req_ids: expected a sequence"));
  if (!seq) throw py::error_already_set();
  const py::ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr()), capacity = last_step.size();
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  if (lens.size() != n) throw py::value_error("context_lens: expected one length per request");
  if (seen_len.size() != capacity || drafted_col.size() != capacity)
    throw py::value_error("ledger: columns of different lengths");
  i64 slots(n);
  std::int64_t* sl = slots.mutable_data();
  if (find_slots(index, items, n, sl, true)) return py::none();
  check_slots(sl, n, capacity);
  {  // ids map to slots one to one: a repeated slot is a repeated id
    std::vector<unsigned char> taken(static_cast<size_t>(capacity), 0);
    for (py::ssize_t i = 0; i < n; ++i) {
      if (taken[sl[i]]) throw py::value_error("a request id appears twice in one step");
      taken[sl[i]] = 1;
    }
  }
  i64 num_new, accepted;
  const std::int64_t* fresh = optional_counts(num_new_obj, n, "num_new", num_new);
  const std::int64_t* acc = optional_counts(accepted_obj, n, "accepted", accepted);
  py::object reports = py::none();
  if (acc) {
    std::vector<std::int64_t> r(n), dd(n), aa(n);
    const py::ssize_t m = take_reports(sl, acc, n, drafted_col.mutable_data(), r.data(), dd.data(), aa.data());
    reports = reports_of(items, r, dd, aa, m);
  }
  i64 out(n);
  record_seen(sl, n, nullptr, step, lens.data(), fresh, last_step.mutable_data(), seen_len.mutable_data(),
              out.mutable_data());
  return py::make_tuple(slots, out, reports);
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

template <class T>
void read_lens(const py::array& a, py::ssize_t n, std::int64_t* out) {
  const T* p = static_cast<const T*>(a.data());
  for (py::ssize_t i = 0; i < n; ++i) out[i] = static_cast<std::int64_t>(p[i]);
}

// vLLM's runner arguments to a custom_class proposer, for rows 0..len(sampled_token_ids): (sampled
// tokens per row, drafted tokens it accepted (sampled - 1: the last sampled token is the bonus or the
// correction), committed context lengths num_tokens_no_spec[:n], each row's cap min(K, room left before
// max_model_len - 1), rows with a sampled token). A row with nothing sampled is a prefill chunk.
py::tuple vllm_rows(py::sequence sampled_token_ids, py::array num_tokens_no_spec, long long max_model_len, long long k) {
  py::object seq = py::reinterpret_steal<py::object>(
      PySequence_Fast(sampled_token_ids.ptr(), "sampled_token_ids: expected a sequence of token lists"));
  if (!seq) throw py::error_already_set();
  const py::ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  if (num_tokens_no_spec.ndim() != 1 || num_tokens_no_spec.shape(0) < n)
    throw py::value_error("num_tokens_no_spec: expected one length per row of sampled_token_ids");
  i64 sampled(n), accepted(n), lens(n), caps(n);
  std::int64_t* s = sampled.mutable_data();
  std::int64_t* a = accepted.mutable_data();
  std::int64_t* l = lens.mutable_data();
  std::int64_t* c = caps.mutable_data();
  py::ssize_t decoding = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    const Py_ssize_t m = PyObject_Length(items[i]);
    if (m < 0) throw py::error_already_set();
    s[i] = m;
    a[i] = std::int64_t(m) - 1;
    decoding += m > 0;
  }
  if (usable_as_is<std::int64_t, py::array::c_style>(num_tokens_no_spec)) {
    read_lens<std::int64_t>(num_tokens_no_spec, n, l);
  } else if (usable_as_is<std::int32_t, py::array::c_style>(num_tokens_no_spec)) {
    read_lens<std::int32_t>(num_tokens_no_spec, n, l);
  } else {
    const auto converted = spec_plugins::as_array<std::int64_t>(num_tokens_no_spec);
    if (!converted) throw py::value_error("num_tokens_no_spec: expected integer lengths");
    read_lens<std::int64_t>(converted, n, l);
  }
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t room = max_model_len - 1 - l[i];
    c[i] = room < 0 ? 0 : (room < k ? room : k);
  }
  return py::make_tuple(sampled, accepted, lens, caps, decoding);
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
  m.def("ledger_step", &ledger_step);
  m.def("batch_columns", &batch_columns);
  m.def("vllm_rows", &vllm_rows);
  m.def("count_and_sum", &count_and_sum);
  m.def("first_over", &first_over);
  m.def("cut_drafts", &cut_drafts);
}
