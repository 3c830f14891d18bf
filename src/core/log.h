// Logging for zaya (spdlog underneath): timestamped lines on stderr, one shared logger.
// ZAYA_LOG_LEVEL=debug|info|warn|error sets the level (default info).
#pragma once
#include <string>

namespace zaya::log {

void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);
void debug(const std::string& message);

}  // namespace zaya::log
