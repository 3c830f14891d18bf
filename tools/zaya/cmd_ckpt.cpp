// `zaya ckpt inspect DIR`: prints a training checkpoint's manifest (step, meta summary, files,
// tensors with shapes; for sharded checkpoints the world size and each tensor's pieces) and
// verifies every checksum; exits non-zero if anything is damaged. DIR may also be a checkpoint
// root, in which case every step-* directory is verified. Versions 1 and 2 are both handled.
// `zaya ckpt reshape --in DIR --ranks M --out ROOT`: rewrites a checkpoint (version 1 or 2) as
// a sharded checkpoint for M ranks (whole tensors, LPT on element counts; ckpt/ownership.h).
#include <cstdio>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "ckpt/dist_checkpoint.h"
#include "commands.h"
#include "core/error.h"

namespace zaya::cli {

namespace {

std::string clip(std::string s, size_t n) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (s.size() <= n) return s;
  size_t cut = n - 3;
  while (cut > 0 && (uint8_t(s[cut]) & 0xc0) == 0x80) --cut;  // keep UTF-8 whole
  return s.substr(0, cut) + "...";
}

std::string bytes_text(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

std::string dump(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// "r0 [0, 853), r1 [853, 2560)" for a sharded tensor's pieces (the first few).
std::string pieces_text(const nlohmann::json& pieces) {
  std::string out;
  size_t shown = 0;
  for (const auto& p : pieces) {
    if (!p.is_object()) continue;
    if (shown == 6) {
      out += ", ... (" + std::to_string(pieces.size()) + " pieces)";
      break;
    }
    const double off = p.value("offset", 0.0), len = p.value("length", 0.0);
    char buf[96];
    std::snprintf(buf, sizeof buf, "%sr%s [%.0f, %.0f)", shown ? ", " : "", dump(p.value("rank", nlohmann::json())).c_str(),
                  off, off + len);
    out += buf;
    ++shown;
  }
  return out;
}

// Prints one checkpoint; returns its problems.
std::vector<std::string> inspect_one(const std::string& dir, bool list_tensors) {
  const bool sharded = checkpoint_format_version(dir) == kDistCheckpointFormatVersion;
  CheckpointReport r = sharded ? verify_dist_checkpoint(dir) : verify_checkpoint(dir);
  const nlohmann::json& m = r.manifest;
  std::printf("checkpoint  %s\n", dir.c_str());
  if (m.is_object()) {
    std::printf("step        %s\n", dump(m.value("step", nlohmann::json())).c_str());
    std::printf("format      %s version %s%s, world size %s, %s checksums\n", m.value("format", "?").c_str(),
                dump(m.value("version", nlohmann::json())).c_str(), sharded ? " (sharded)" : "",
                dump(m.value("world_size", nlohmann::json(1))).c_str(), m.value("checksum_algorithm", "?").c_str());
    std::printf("created     %s\n", m.value("created", "?").c_str());
    if (m.contains("reshaped_from") && m["reshaped_from"].is_object())
      std::printf("reshaped    from %s (world size %s)\n", m["reshaped_from"].value("dir", "?").c_str(),
                  dump(m["reshaped_from"].value("world_size", nlohmann::json())).c_str());
    const nlohmann::json meta = m.value("meta", nlohmann::json::object());
    if (meta.is_object() && !meta.empty()) {
      std::printf("meta\n");
      for (auto it = meta.begin(); it != meta.end(); ++it)
        std::printf("  %-22s %s\n", it.key().c_str(),
                    clip(it->is_string() ? it->get<std::string>() : dump(*it), 90).c_str());
    } else if (!meta.empty()) {
      std::printf("meta        %s\n", clip(dump(meta), 100).c_str());
    }
    if (m.contains("files") && m["files"].is_array()) {
      std::printf("files\n");
      for (const auto& f : m["files"])
        if (f.is_object())
          std::printf("  %-32s rank %-4s %12s  crc32c %s\n", f.value("name", "?").c_str(),
                      dump(f.value("rank", nlohmann::json())).c_str(),
                      f.contains("bytes") && f["bytes"].is_number()
                          ? bytes_text(f["bytes"].get<double>()).c_str()
                          : "?",
                      f.value("checksum", "?").c_str());
    }
    if (m.contains("tensors") && m["tensors"].is_array()) {
      double elements = 0;
      for (const auto& t : m["tensors"]) {
        double n = 1;
        if (t.is_object() && t.contains("shape") && t["shape"].is_array())
          for (const auto& d : t["shape"]) n *= d.is_number() ? d.get<double>() : 0;
        elements += n;
      }
      std::printf("tensors     %zu (%.0f elements)\n", m["tensors"].size(), elements);
      if (list_tensors)
        for (const auto& t : m["tensors"]) {
          if (!t.is_object()) continue;
          if (sharded) {
            std::printf("  %-48s %-14s %-10s %s\n", t.value("name", "?").c_str(),
                        dump(t.value("shape", nlohmann::json())).c_str(), t.value("group", "?").c_str(),
                        pieces_text(t.value("pieces", nlohmann::json::array())).c_str());
            continue;
          }
          std::string files;
          if (t.contains("pieces") && t["pieces"].is_array())
            for (const auto& p : t["pieces"])
              if (p.is_object()) files += (files.empty() ? "" : ",") + p.value("file", std::string("?"));
          std::printf("  %-56s %-18s %s  %s\n", t.value("name", "?").c_str(),
                      dump(t.value("shape", nlohmann::json())).c_str(), t.value("dtype", "?").c_str(),
                      files.c_str());
        }
    }
  }
  if (r.ok()) {
    std::printf(sharded ? "verify      OK: manifest, file sizes, and every file and piece checksum match\n"
                        : "verify      OK: manifest, file sizes, headers and every checksum match\n");
  } else {
    std::printf("verify      DAMAGED: %zu problem(s)\n", r.problems.size());
    for (const auto& p : r.problems) std::printf("  - %s\n", p.c_str());
  }
  return r.problems;
}

void run_inspect(const std::string& dir, bool list_tensors) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("ckpt", dir + ": not a directory", "pass a step-* checkpoint directory or a checkpoint root");
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) {
    auto problems = inspect_one(dir, list_tensors);
    std::fflush(stdout);
    if (!problems.empty()) fail("ckpt", dir + ": damaged checkpoint: " + problems.front());
    return;
  }
  auto all = list_checkpoints(dir);
  if (all.empty()) {
    // A step directory whose manifest is gone: report it through the verifier.
    auto problems = inspect_one(dir, list_tensors);
    std::fflush(stdout);
    fail("ckpt", dir + ": " + (problems.empty() ? "no checkpoint here" : problems.front()),
         "pass a step-* checkpoint directory or a root holding step-* directories");
  }
  size_t damaged = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i) std::printf("\n");
    if (!inspect_one(all[i].dir, list_tensors && i == 0).empty()) ++damaged;
  }
  std::fflush(stdout);
  if (damaged) fail("ckpt", dir + ": " + std::to_string(damaged) + " of " + std::to_string(all.size()) + " checkpoints are damaged");
}

void run_reshape(const std::string& in, int ranks, const std::string& out, int keep_last) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(in, ec)) fail("ckpt", in + ": not a directory", "pass a step-* checkpoint directory or a checkpoint root");
  std::optional<DistCheckpoint> ck;
  if (fs::exists(fs::path(in) / "manifest.json", ec)) {
    ck = open_dist_checkpoint(in);
  } else {
    ck = load_latest_dist_checkpoint(in);
    if (!ck) fail("ckpt", in + ": no valid checkpoint here", "pass a step-* checkpoint directory or a root holding step-* directories");
  }
  DistReshapeOptions opts;
  opts.keep_last = keep_last;
  const std::string dir = reshape_dist_checkpoint(*ck, out, ranks, opts);
  DistCheckpoint res = open_dist_checkpoint(dir);
  std::printf("reshaped    %s (step %lld, %d rank%s) -> %s (%d rank%s)\n", ck->dir().c_str(), (long long)ck->step(),
              ck->world_size(), ck->world_size() == 1 ? "" : "s", dir.c_str(), ranks, ranks == 1 ? "" : "s");
  for (const auto& f : res.manifest()["files"])
    std::printf("  %-20s %12s\n", f.value("name", "?").c_str(), bytes_text(f.value("bytes", 0.0)).c_str());
}

}  // namespace

void add_ckpt(CLI::App& app) {
  auto* cmd = app.add_subcommand("ckpt", "Inspect, verify and reshape training checkpoints");
  cmd->require_subcommand(1);
  auto* inspect = cmd->add_subcommand("inspect", "Print a checkpoint's manifest and verify every checksum");
  static std::string dir;
  static bool no_tensors = false;
  inspect->add_option("dir", dir, "A step-* checkpoint directory, or a root holding several")->required();
  inspect->add_flag("--no-tensors", no_tensors, "Do not list the tensors");
  inspect->callback([] { run_inspect(dir, !no_tensors); });

  auto* reshape = cmd->add_subcommand(
      "reshape", "Rewrite a checkpoint as a sharded checkpoint for another number of ranks");
  static std::string in_dir, out_root;
  static int ranks = 1, keep_last = 0;
  reshape->add_option("--in", in_dir, "A step-* checkpoint directory (version 1 or 2), or a root (its latest valid one)")
      ->required();
  reshape->add_option("--ranks", ranks, "The new number of ranks")->required()->check(CLI::Range(1, 100000));
  reshape->add_option("--out", out_root, "Checkpoint root to write step-<step>/ into (not the input's root)")->required();
  reshape->add_option("--keep-last", keep_last, "Checkpoints to keep under --out (0: all)");
  reshape->callback([] { run_reshape(in_dir, ranks, out_root, keep_last); });
}

}  // namespace zaya::cli
