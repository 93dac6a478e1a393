// What vLLM's runner hands a custom_class proposer (vllm/proposer.py), as the drafting layer's columns, in one
// call per engine step.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "../fast_array.hpp"

#include <cstdint>

namespace py = pybind11;

namespace {

using spec_plugins::usable_as_is;
using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style>;

template <class T>
void read_lens(const py::array& a, py::ssize_t n, std::int64_t* out) {
  const T* p = static_cast<const T*>(a.data());
  for (py::ssize_t i = 0; i < n; ++i) out[i] = static_cast<std::int64_t>(p[i]);
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

}  // namespace

PYBIND11_MODULE(_rows, m) {
  m.doc() = "vLLM's runner arguments to a custom_class proposer as the drafting layer's columns.";
  m.def("from_runner", &from_runner);
}
