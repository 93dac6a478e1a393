// What the suffix tree's two binding modules share: token ids read from Python (lists, tuples or 1-D integer
// numpy arrays, validated as integers in [0, 2^31) before any state changes), drafts returned to it, and the
// checks of the arguments both take. _core.cpp binds the engine's cache, _testing.cpp the test-only tree.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tree.hpp"

namespace suffix_tree {
namespace binding {

namespace py = pybind11;

// The name of the capsule that hands a SuffixCache's C++ cache to the test-only module.
constexpr const char* kCacheCapsule = "suffix_tree::Cache";

[[noreturn]] inline void bad_token(const char* what, Py_ssize_t i, const std::string& got) {
  throw py::value_error(std::string(what) + ": token id at position " + std::to_string(i) +
                        " must be an integer in [0, 2**31), got " + got);
}

template <class T>
void read_array(const py::array& arr, Py_ssize_t from, std::vector<i32>& out, const char* what) {
  auto a = arr.unchecked<T, 1>();
  for (Py_ssize_t i = from; i < a.shape(0); ++i) {
    const T v = a(i);
    if (v < 0 || static_cast<unsigned long long>(v) > 0x7fffffffull) bad_token(what, i, std::to_string(v));
    out.push_back(i32(v));
  }
}

// Appends obj[from:] to out. Returns the length of obj.
inline Py_ssize_t read_tokens(py::handle obj, std::vector<i32>& out, const char* what, Py_ssize_t from = 0) {
  out.clear();
  if (py::isinstance<py::array>(obj)) {
    py::array arr = py::reinterpret_borrow<py::array>(obj);
    if (arr.ndim() != 1) throw py::value_error(std::string(what) + ": expected a 1-D sequence of token ids");
    const Py_ssize_t n = arr.shape(0);
    if (from > n) return n;
    const char kind = arr.dtype().kind();
    const auto size = arr.itemsize();
    out.reserve(n - from);
    if (kind == 'i' && size == 4) read_array<std::int32_t>(arr, from, out, what);
    else if (kind == 'i' && size == 8) read_array<std::int64_t>(arr, from, out, what);
    else if (kind == 'u' && size == 4) read_array<std::uint32_t>(arr, from, out, what);
    else if (kind == 'u' && size == 8) read_array<std::uint64_t>(arr, from, out, what);
    else if (kind == 'i' || kind == 'u')
      read_array<std::int64_t>(arr.attr("astype")("int64").cast<py::array>(), from, out, what);
    else
      throw py::value_error(std::string(what) + ": expected integer token ids, got an array of dtype " +
                            std::string(py::str(arr.dtype())));
    return n;
  }
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
    throw py::value_error(std::string(what) + ": expected a sequence of token ids, got a string");
  PyObject* seq = PySequence_Fast(obj.ptr(), "");
  if (!seq) {
    PyErr_Clear();
    throw py::value_error(std::string(what) + ": expected a sequence of token ids, got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  py::object guard = py::reinterpret_steal<py::object>(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  if (from > n) return n;
  out.reserve(n - from);
  for (Py_ssize_t i = from; i < n; ++i) {
    PyObject* it = items[i];
    if (PyBool_Check(it)) bad_token(what, i, std::string(py::repr(it)));
    long long v;
    if (PyLong_Check(it)) {
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(it, &overflow);
      if (overflow) bad_token(what, i, std::string(py::repr(it)));
    } else {
      PyObject* idx = PyNumber_Index(it);  // numpy integer scalars; floats are refused
      if (!idx) {
        PyErr_Clear();
        bad_token(what, i, std::string(py::repr(it)));
      }
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(idx, &overflow);
      Py_DECREF(idx);
      if (overflow) bad_token(what, i, std::string(py::repr(it)));
    }
    if (v < 0 || v > 0x7fffffffLL) bad_token(what, i, std::to_string(v));
    out.push_back(i32(v));
  }
  return n;
}

inline py::tuple to_python(const Draft& d) {
  py::list toks(d.tokens.size()), probs(d.probs.size());
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    PyList_SET_ITEM(toks.ptr(), i, PyLong_FromLong(d.tokens[i]));
    PyList_SET_ITEM(probs.ptr(), i, PyFloat_FromDouble(d.probs[i]));
  }
  return py::make_tuple(toks, probs, d.score, d.match_len);
}

inline SpecParams check_params(double factor, double offset, double min_prob) {
  if (!std::isfinite(factor) || factor < 0) throw py::value_error("max_spec_factor: expected a finite value >= 0");
  if (!std::isfinite(offset)) throw py::value_error("max_spec_offset: expected a finite value");
  if (!(min_prob >= 0 && min_prob <= 1)) throw py::value_error("min_token_prob: expected a value in [0, 1]");
  SpecParams sp;
  sp.factor = factor;
  sp.offset = offset;
  sp.min_prob = min_prob;
  return sp;
}

inline i32 check_depth(long long d) {
  if (d < 1 || d > 4096) throw py::value_error("max_depth: expected an integer in [1, 4096], got " + std::to_string(d));
  return i32(d);
}

inline i32 check_max_tokens(long long m) {
  if (m < 0) throw py::value_error("max_tokens: expected an integer >= 0, got " + std::to_string(m));
  return m > 0x7fffffffLL ? 0x7fffffff : i32(m);
}


}  // namespace binding
}  // namespace suffix_tree
