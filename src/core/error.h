// Errors that help: every failure names the component, the file or object, the field,
// what was expected, and a hint. All zaya code throws zaya::Error; the CLI prints it.
#pragma once
#include <stdexcept>
#include <string>

namespace zaya {

class Error : public std::runtime_error {
 public:
  Error(std::string component, std::string message, std::string hint = {});
  const std::string& component() const { return component_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string component_, message_, hint_;
};

// Throws Error("component", message, hint). Use for every user-facing failure.
[[noreturn]] void fail(const std::string& component, const std::string& message,
                       const std::string& hint = {});

// Internal invariant check: a failure here is a zaya bug, not bad input.
#define ZAYA_CHECK(cond, msg)                                                           \
  do {                                                                                  \
    if (!(cond)) ::zaya::fail("internal", std::string(msg) + " [" #cond "] at " __FILE__); \
  } while (0)

}  // namespace zaya
