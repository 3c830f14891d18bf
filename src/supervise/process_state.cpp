// Reads a process's threads from /proc/<pid>/task/*/status. See process_state.h.
#include "supervise/process_state.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace zaya {

namespace {

// The value of a "Name:\tvalue" line of a status file, or "" when absent.
std::string status_field(const std::string& status_text, const std::string& name) {
  std::istringstream lines(status_text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() <= name.size() || line.compare(0, name.size(), name) != 0 || line[name.size()] != ':')
      continue;
    const auto value = line.find_first_not_of(" \t", name.size() + 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

bool mask_has_sigkill(const std::string& hex_mask) {
  if (hex_mask.empty()) return false;
  try {
    return (std::stoull(hex_mask, nullptr, 16) >> (SIGKILL - 1)) & 1;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

bool process_is_exiting(int64_t pid) {
  if (pid <= 0) return false;
  const std::string leader = std::to_string(pid);
  std::error_code ec;
  std::filesystem::directory_iterator tasks("/proc/" + leader + "/task", ec);
  if (ec) return false;
  for (const auto& task : tasks) {
    std::ifstream in(task.path() / "status");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.empty()) continue;  // the thread ended while we looked
    const std::string state = status_field(text, "State");
    if (task.path().filename() == leader && !state.empty() && (state[0] == 'Z' || state[0] == 'X'))
      return true;
    if (mask_has_sigkill(status_field(text, "SigPnd")) || mask_has_sigkill(status_field(text, "ShdPnd")))
      return true;
  }
  return false;
}

}  // namespace zaya
