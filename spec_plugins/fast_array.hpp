// Numpy arguments without numpy's conversion call when none is needed.
//
// pybind11 loads a py::array_t<T, Flags> argument through PyArray_FromAny even when the array already has
// T's type, native byte order and the layout asked for: ~250 ns per argument, which is most of a small
// compiled call (the drafting step at batch 1 makes ~20 such arguments). `as_array` and the `CArray`
// argument type take such an array as it is (a new reference to the same object, as PyArray_FromAny would
// return) and leave every other input to pybind11's conversion, so what is accepted, converted or refused
// is unchanged.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <utility>

namespace spec_plugins {

namespace py = pybind11;

// True when `h` is an ndarray of T (native byte order, aligned) that already satisfies Flags' layout.
template <class T, int Flags>
bool usable_as_is(py::handle h) {
  const auto& api = py::detail::npy_api::get();
  if (!api.PyArray_Check_(h.ptr())) return false;
  const auto* a = py::detail::array_proxy(h.ptr());
  int need = api.NPY_ARRAY_ALIGNED_;
  if (Flags & py::array::c_style) need |= api.NPY_ARRAY_C_CONTIGUOUS_;
  if (Flags & py::array::f_style) need |= api.NPY_ARRAY_F_CONTIGUOUS_;
  if ((a->flags & need) != need) return false;
  const auto* d = py::detail::array_descriptor_proxy(a->descr);
  return d->type_num == py::detail::npy_format_descriptor<T>::value && d->byteorder != '>';
}

// `h` as an array_t<T, Flags>: the same object when usable as is, else pybind11's conversion (an empty
// handle where that fails, with no Python error set, as array_t::ensure).
template <class T, int Flags = py::array::c_style | py::array::forcecast>
py::array_t<T, Flags> as_array(py::handle h) {
  if (usable_as_is<T, Flags>(h)) return py::reinterpret_borrow<py::array_t<T, Flags>>(h);
  return py::array_t<T, Flags>::ensure(h);
}

// `h` as it is when it is a usable 1-D array of T with n entries (any number when n < 0), else an empty
// handle (the caller converts and checks it the slow way, with its own errors).
template <class T>
py::array_t<T> vector_as_is(py::handle h, py::ssize_t n) {
  if (!usable_as_is<T, py::array::c_style>(h)) return py::reinterpret_steal<py::array_t<T>>(py::handle());
  const auto* a = py::detail::array_proxy(h.ptr());
  if (a->nd != 1 || (n >= 0 && a->dimensions[0] != n)) return py::reinterpret_steal<py::array_t<T>>(py::handle());
  return py::reinterpret_borrow<py::array_t<T>>(h);
}

// An argument type: a py::array_t<T, Flags> loaded through `as_array`.
template <class T, int Flags = py::array::c_style | py::array::forcecast>
class CArray : public py::array_t<T, Flags> {
 public:
  using Base = py::array_t<T, Flags>;
  using Base::Base;
  CArray() : Base(py::handle(), py::object::borrowed_t{}) {}  // empty until loaded: no allocation
  CArray(Base&& a) : Base(std::move(a)) {}  // NOLINT(google-explicit-constructor)
};

}  // namespace spec_plugins

namespace pybind11 {
namespace detail {

// (The second argument makes this more specialized than pybind11's caster of every py::object subclass.)
template <class T, int Flags>
struct type_caster<spec_plugins::CArray<T, Flags>, enable_if_t<is_pyobject<spec_plugins::CArray<T, Flags>>::value>> {
  using Value = spec_plugins::CArray<T, Flags>;
  PYBIND11_TYPE_CASTER(Value, handle_type_name<typename Value::Base>::name);

  bool load(handle src, bool convert) {
    if (!convert && !Value::Base::check_(src)) return false;
    value = Value(spec_plugins::as_array<T, Flags>(src));
    return static_cast<bool>(value);
  }
  static handle cast(const Value& src, return_value_policy, handle) { return src.inc_ref(); }
};

}  // namespace detail
}  // namespace pybind11
