// What vLLM's runners hand our proposers, as the drafting layer's columns, in one call per engine step:
//   from_runner     V1's custom_class proposer (vllm/proposer.py)
//   runner_v2_rows  Model Runner V2's speculator (vllm/mrv2/speculator.py), with the host mirror of the lengths
//                   and the filler
//   write_padded    the drafts over that filler, for a runner that verifies a fixed width

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "../fast_array.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using spec_plugins::usable_as_is;
using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style>;

template <class T>
void read_lens(const py::array& a, py::ssize_t n, std::int64_t* out) {
  const T* p = static_cast<const T*>(a.data());
  for (py::ssize_t i = 0; i < n; ++i) out[i] = static_cast<std::int64_t>(p[i]);
}

// The first n entries of integer array `a` into out: int64 and int32 (what vLLM keeps) read as they are, anything
// else converted; false where `a` does not convert to integers.
bool read_ints(const py::array& a, py::ssize_t n, std::int64_t* out) {
  if (usable_as_is<std::int64_t, py::array::c_style>(a)) {
    read_lens<std::int64_t>(a, n, out);
  } else if (usable_as_is<std::int32_t, py::array::c_style>(a)) {
    read_lens<std::int32_t>(a, n, out);
  } else {
    const auto converted = spec_plugins::as_array<std::int64_t>(a);
    if (!converted) return false;
    read_lens<std::int64_t>(converted, n, out);
  }
  return true;
}

// vLLM's runner arguments to a custom_class proposer, for rows 0..len(sampled_token_ids): (sampled
// tokens per row, drafted tokens it accepted (sampled - 1: the last sampled token is the bonus or the
// correction), committed context lengths num_tokens_no_spec[:n], each row's cap min(K, room left before
// max_model_len - 1), rows with a sampled token). A row with nothing sampled is a prefill chunk.
py::tuple from_runner(py::sequence sampled_token_ids, py::array num_tokens_no_spec, long long max_model_len, long long k) {
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
  if (!read_ints(num_tokens_no_spec, n, l)) throw py::value_error("num_tokens_no_spec: expected integer lengths");
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t room = max_model_len - 1 - l[i];
    c[i] = room < 0 ? 0 : (room < k ? room : k);
  }
  return py::make_tuple(sampled, accepted, lens, caps, decoding);
}

// Per-request counts of the runner's rows 0..n as int64.
std::vector<std::int64_t> counts_of(const py::array& a, py::ssize_t n, const char* what) {
  if (a.ndim() != 1 || a.shape(0) < n) throw py::value_error(std::string(what) + ": expected one count per row");
  std::vector<std::int64_t> out(n);
  if (!read_ints(a, n, out.data())) throw py::value_error(std::string(what) + ": expected integer counts");
  return out;
}

// A writable C-contiguous [rows >= `rows`, width] buffer of T.
template <class T>
T* rows_of(py::array& a, const char* what, py::ssize_t rows) {
  if (!usable_as_is<T, py::array::c_style>(a) || a.ndim() != 2 || a.shape(0) < rows || !a.writeable())
    throw py::value_error(std::string(what) + ": expected a writable C-contiguous [rows, width] buffer of its dtype");
  return static_cast<T*>(a.mutable_data());
}

// The confidences buffer beside the drafts buffer `out` (float32, the same shape), nullptr for None; `keep` holds it
// while the pointer is used.
float* confidences_beside(const py::object& obj, const py::array& out, py::array& keep) {
  if (obj.is_none()) return nullptr;
  keep = obj.cast<py::array>();
  float* p = rows_of<float>(keep, "confidences buffer", out.shape(0));
  if (keep.shape(0) != out.shape(0) || keep.shape(1) != out.shape(1))
    throw py::value_error("confidences buffer: expected the drafts buffer's shape");
  return p;
}

// Model Runner V2's step, for batch rows 0..n (slots[i]: the request's row in the runner's state): the host mirror
// of the lengths grows by what was sampled (total_len[slots[i]] += sampled[i], the rule by which the runner's
// post_update grows its own), every batch row of `out` gets the filler over its whole width (the last token of
// the history, as vLLM's own speculators pad) and of `conf` (where given) 0, so filler is trimmed first. A row
// drafts when it sampled (a prefill chunk in progress did not) and is not vLLM's warm-up. Returns (batch rows
// that draft, None when all do; their history rows; context lengths; tokens new; drafts accepted (new - 1); caps
// min(k, room before max_model_len - 1); slots verified (accepted + rejected), None without `rejected`; batch
// rows of prefill chunks in progress, None when all draft).
py::tuple runner_v2_rows(i64 slots, py::object sampled_obj, py::object rejected_obj, i64 total_len,
                         spec_plugins::CArray<std::int32_t, py::array::c_style> history,
                         spec_plugins::CArray<bool, py::array::c_style> warmup, py::array out, py::object conf_obj,
                         long long max_model_len, long long k) {
  const py::ssize_t n = slots.size(), reqs = total_len.size();
  const auto sampled = counts_of(sampled_obj.cast<py::array>(), n, "num_sampled");
  std::vector<std::int64_t> rejected;
  if (!rejected_obj.is_none()) rejected = counts_of(rejected_obj.cast<py::array>(), n, "num_rejected");
  if (history.ndim() != 2 || history.shape(0) != reqs || warmup.size() != reqs)
    throw py::value_error("runner state: expected history [max_num_reqs, max_model_len] and one flag per slot");
  std::int64_t* out_p = rows_of<std::int64_t>(out, "drafts buffer", n);
  const py::ssize_t width = out.shape(1), hist_width = history.shape(1);
  py::array conf;
  float* conf_p = confidences_beside(conf_obj, out, conf);
  const std::int64_t* sl = slots.data();
  std::int64_t* total = total_len.mutable_data();
  const std::int32_t* hist = history.data();
  const bool* warm = warmup.data();
  for (py::ssize_t i = 0; i < n; ++i) {  // checked before anything is written: a refused step changes no state
    if (sl[i] < 0 || sl[i] >= reqs) throw py::value_error("slots: request slot out of range");
    if (total[sl[i]] + sampled[i] > hist_width) throw py::value_error("num_sampled: length past max_model_len");
  }
  std::vector<py::ssize_t> live, present;
  live.reserve(n);
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t s = sl[i];
    const std::int64_t t = total[s] + sampled[i];
    total[s] = t;
    const std::int64_t filler = t > 0 ? hist[s * hist_width + t - 1] : 0;
    std::fill(out_p + i * width, out_p + (i + 1) * width, filler);
    if (conf_p) std::fill(conf_p + i * width, conf_p + (i + 1) * width, 0.0f);
    if (warm[s]) continue;
    (sampled[i] > 0 ? live : present).push_back(i);
  }
  const py::ssize_t m = static_cast<py::ssize_t>(live.size());
  const bool all = m == n;
  i64 rows(all ? 0 : m), hist_rows(m), lens(m), fresh(m), accepted(m), caps(m), verified(rejected.empty() ? 0 : m);
  for (py::ssize_t j = 0; j < m; ++j) {
    const py::ssize_t i = live[j];
    if (!all) rows.mutable_data()[j] = i;
    hist_rows.mutable_data()[j] = sl[i];
    const std::int64_t len = total[sl[i]];
    lens.mutable_data()[j] = len;
    fresh.mutable_data()[j] = sampled[i];
    accepted.mutable_data()[j] = sampled[i] - 1;
    const std::int64_t room = std::max<std::int64_t>(max_model_len - 1 - len, 0);
    caps.mutable_data()[j] = std::min<std::int64_t>(room, std::max<long long>(k, 0));
    if (!rejected.empty()) verified.mutable_data()[j] = sampled[i] - 1 + rejected[i];
  }
  py::object present_rows = py::none();
  if (!all) {
    i64 p(static_cast<py::ssize_t>(present.size()));
    std::copy(present.begin(), present.end(), p.mutable_data());
    present_rows = p;
  }
  return py::make_tuple(all ? py::object(py::none()) : py::object(rows), hist_rows, lens, fresh, accepted, caps,
                        rejected.empty() ? py::object(py::none()) : py::object(verified), present_rows);
}

// Draft i (tokens[offsets[i]:offsets[i + 1]]) from column 0 of row rows[i] of `out` (row i where rows is None),
// which already holds the filler; `conf` (where given) gets the draft's confidences (1.0 where it has none) over
// the same cells.
void write_padded(py::array out, py::object rows_obj, py::array tokens_obj, i64 offsets, py::object confidence_obj,
                  py::object conf_obj) {
  const py::ssize_t n = offsets.size() - 1;
  if (n < 0) throw py::value_error("offsets: expected n + 1 offsets");
  std::int64_t* out_p = rows_of<std::int64_t>(out, "drafts buffer", 0);
  const py::ssize_t width = out.shape(1), height = out.shape(0);
  i64 rows;
  if (!rows_obj.is_none()) {
    rows = rows_obj.cast<i64>();
    if (rows.size() != n) throw py::value_error("rows: expected one row per draft");
  }
  const auto tokens = spec_plugins::as_array<std::int64_t>(tokens_obj);
  if (!tokens) throw py::value_error("tokens: expected integer token ids");
  const std::int64_t* off = offsets.data();
  if (off[0] != 0 || off[n] != tokens.size()) throw py::value_error("offsets: expected 0 .. len(tokens)");
  py::object confidence_kept;  // holds the converted confidences while c points into them
  const double* c = nullptr;
  if (!confidence_obj.is_none()) {
    const auto confidence = spec_plugins::as_array<double>(confidence_obj);
    if (!confidence || confidence.size() != tokens.size())
      throw py::value_error("confidence: expected one per drafted token");
    c = confidence.data();
    confidence_kept = confidence;
  }
  py::array conf;
  float* conf_p = confidences_beside(conf_obj, out, conf);
  const std::int64_t* tok = tokens.data();
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t r = rows ? rows.data()[i] : i;
    const std::int64_t a = off[i], len = off[i + 1] - a;
    if (r < 0 || r >= height) throw py::value_error("rows: row out of range");
    if (len < 0 || len > width) throw py::value_error("drafts: a draft longer than the buffer is wide");
    std::copy(tok + a, tok + a + len, out_p + r * width);
    if (conf_p) {
      float* row = conf_p + r * width;
      for (std::int64_t j = 0; j < len; ++j) row[j] = c ? static_cast<float>(c[a + j]) : 1.0f;
    }
  }
}

}  // namespace

PYBIND11_MODULE(_rows, m) {
  m.doc() = "vLLM's runner arguments to our proposers as the drafting layer's columns.";
  m.def("from_runner", &from_runner);
  m.def("runner_v2_rows", &runner_v2_rows, py::arg("slots"), py::arg("sampled"), py::arg("rejected"),
        py::arg("total_len"), py::arg("history"), py::arg("warmup"), py::arg("out"), py::arg("conf"),
        py::arg("max_model_len"), py::arg("k"));
  m.def("write_padded", &write_padded, py::arg("out"), py::arg("rows"), py::arg("tokens"), py::arg("offsets"),
        py::arg("confidence"), py::arg("conf"));
}
