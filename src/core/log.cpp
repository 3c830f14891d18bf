// The shared spdlog logger behind zaya::log.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace zaya::log {

namespace {
spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_color_mt("zaya");
    lg->set_pattern("[%H:%M:%S] [zaya] %^%l%$ %v");
    const char* level = std::getenv("ZAYA_LOG_LEVEL");
    lg->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
    return lg;
  }();
  return *l;
}
}  // namespace

void info(const std::string& m) { logger().info(m); }
void warn(const std::string& m) { logger().warn(m); }
void error(const std::string& m) { logger().error(m); }
void debug(const std::string& m) { logger().debug(m); }

}  // namespace zaya::log
