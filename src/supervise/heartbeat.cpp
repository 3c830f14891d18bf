// Heartbeat files: atomic writes (temporary + rename) and tolerant reads. See heartbeat.h.
#include "supervise/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace zaya {

namespace fs = std::filesystem;

std::string heartbeat_path(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.json", rank);
  return (fs::path(dir) / name).string();
}

HeartbeatWriter::HeartbeatWriter(std::string dir, int rank, int world)
    : dir_(std::move(dir)), rank_(rank), world_(world) {}

void HeartbeatWriter::beat(const std::string& phase, int64_t step, int64_t total_steps) {
  if (dir_.empty()) return;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json j{{"rank", rank_},  {"world", world_}, {"pid", int64_t(getpid())},   {"host", host},
                   {"phase", phase}, {"step", step},    {"total_steps", total_steps}, {"time", now}};
  const std::string path = heartbeat_path(dir_, rank_);
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  fs::create_directories(dir_, ec);
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << '\n';
    ok = bool(out.flush());
  }
  if (ok) {
    fs::rename(tmp, path, ec);
    ok = !ec;
  }
  if (!ok && !warned_) {
    warned_ = true;
    std::fprintf(
        stderr,
        "zaya: warning: cannot write the heartbeat %s (%s); a supervisor may take this rank for hung\n",
        path.c_str(), ec ? ec.message().c_str() : "write failed");
  }
}

std::vector<HeartbeatRecord> read_heartbeats(const std::string& dir) {
  std::vector<HeartbeatRecord> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) != 0 || it->path().extension() != ".json") continue;
    std::ifstream in(it->path());
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    try {
      HeartbeatRecord r;
      r.rank = j.at("rank").get<int>();
      r.world = j.at("world").get<int>();
      r.pid = j.at("pid").get<int64_t>();
      r.host = j.at("host").get<std::string>();
      r.phase = j.at("phase").get<std::string>();
      r.step = j.at("step").get<int64_t>();
      r.total_steps = j.at("total_steps").get<int64_t>();
      r.time = j.at("time").get<double>();
      out.push_back(std::move(r));
    } catch (const nlohmann::json::exception&) {
      continue;  // not a heartbeat of this format
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return out;
}

void reset_heartbeat_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("rank-", 0) == 0) stale.push_back(it->path());
  for (const fs::path& p : stale) fs::remove(p, ec);
}

}  // namespace zaya
