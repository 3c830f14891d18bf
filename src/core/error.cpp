// zaya::Error formatting: "component: message (hint: ...)".
#include "core/error.h"

namespace zaya {

static std::string format_error(const std::string& component, const std::string& message,
                                const std::string& hint) {
  std::string s = component + ": " + message;
  if (!hint.empty()) s += " (hint: " + hint + ")";
  return s;
}

Error::Error(std::string component, std::string message, std::string hint)
    : std::runtime_error(format_error(component, message, hint)),
      component_(std::move(component)),
      message_(std::move(message)),
      hint_(std::move(hint)) {}

void fail(const std::string& component, const std::string& message, const std::string& hint) {
  throw Error(component, message, hint);
}

}  // namespace zaya
