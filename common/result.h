// Result<T>: an expected value or an error message that names the cause.
// Expected failures (bad input, I/O errors, a peer gone) travel as values; library code
// never logs, the program logs once where it handles the error.
#pragma once

#include <cassert>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace expertd {

struct Error {
  std::string message;
  int errno_value = 0;  // 0 when the failure is not a system call's
};

inline Error make_error(std::string message) {
  return Error{std::move(message), 0};
}
inline Error errno_error(const std::string& what, int err = errno) {
  return Error{what + ": " + std::strerror(err), err};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return err_;
  }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Result<void>;

// Propagate an error from an expression yielding Result<...>.
#define EXPERTD_TRY(expr)                              \
  do {                                                 \
    auto&& _r = (expr);                                \
    if (!_r.ok()) return ::expertd::Error(_r.error()); \
  } while (0)

}  // namespace expertd
