// The drafting layer's ledger (drafting.py) and request slots (slots.py), a whole step in one call: they run on
// every engine step, where a numpy call per column costs more than the work (dozens per step at batch 1).
//   lookup_slots   RequestSlots' id -> slot lookup of a whole step
//   ledger_seen    which tokens are new since each request was last seen, recorded as seen
//   ledger_reports the verification results to report to the policy, each draft once
//   ledger_step    the ledger's whole step when every request is known: lookup, reports, seen
//   first_over     the first draft longer than its cap (the layer's check of a proposer's drafts)

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "fast_array.hpp"

#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style>;

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
// and ledger_seen (no request new) return, in the same order of effects. `verified` (where given: slots the
// engine verified of each request's last draft) first lowers each drafted entry to it, so a report covers only
// what was tried. A repeated id raises before any column is written.
py::object ledger_step(py::dict index, py::sequence req_ids, long long step, i64 lens, py::object num_new_obj,
                       py::object accepted_obj, i64 last_step, i64 seen_len, i64 drafted_col,
                       py::object verified_obj) {
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
  i64 num_new, accepted, verified;
  const std::int64_t* fresh = optional_counts(num_new_obj, n, "num_new", num_new);
  const std::int64_t* acc = optional_counts(accepted_obj, n, "accepted", accepted);
  const std::int64_t* ver = optional_counts(verified_obj, n, "verified", verified);
  if (ver) {
    std::int64_t* drafted = drafted_col.mutable_data();
    for (py::ssize_t i = 0; i < n; ++i) drafted[sl[i]] = std::min(drafted[sl[i]], ver[i]);
  }
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

// The first row whose draft is longer than its cap, or -1.
long long first_over(i64 lengths, i64 caps) {
  if (lengths.size() != caps.size()) throw py::value_error("drafts: one cap per draft");
  const std::int64_t* l = lengths.data();
  const std::int64_t* c = caps.data();
  for (py::ssize_t i = 0; i < lengths.size(); ++i)
    if (l[i] > c[i]) return i;
  return -1;
}

}  // namespace

PYBIND11_MODULE(_ledger, m) {
  m.doc() = "The drafting layer's ledger and request slots, a step per call (drafting.py, slots.py).";
  m.def("lookup_slots", &lookup_slots);
  m.def("ledger_seen", &ledger_seen);
  m.def("ledger_reports", &ledger_reports);
  m.def("ledger_step", &ledger_step, py::arg("index"), py::arg("req_ids"), py::arg("step"), py::arg("lens"),
        py::arg("num_new"), py::arg("accepted"), py::arg("last_step"), py::arg("seen_len"), py::arg("drafted"),
        py::arg("verified") = py::none());
  m.def("first_over", &first_over);
}
