// How an inference API request fails: an HTTP status, an OpenAI-style error type and a
// message that names the field and what was expected. The HTTP layer turns it into
// {"error": {"message", "type"}}; nothing here knows about sockets.
#pragma once
#include <stdexcept>
#include <string>

namespace zaya {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message)
      : std::runtime_error(message), status_(status), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string type_;
};

// 400 invalid_request_error: the client sent something this API does not accept.
[[noreturn]] inline void invalid_request(const std::string& message) {
  throw ApiError(400, "invalid_request_error", message);
}

}  // namespace zaya
