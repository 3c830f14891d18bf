// Sharded-checkpoint manifest: rank tables, tiling check, formatting and parsing (see
// dist_manifest.h and docs/checkpoint-format.md, "Format version 2: sharded").
#include "ckpt/dist_manifest.h"

#include <algorithm>
#include <map>
#include <set>

#include "ckpt/checksum.h"
#include "ckpt/dist_io.h"
#include "core/error.h"

namespace zaya::dist_manifest {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

using manifest_common::get_uint;

bool get_field_uint(const json& obj, const char* key, uint64_t* out) {
  return obj.is_object() && obj.contains(key) && get_uint(obj[key], out);
}

bool get_field_string(const json& obj, const char* key, std::string* out) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return false;
  *out = obj[key].get<std::string>();
  return true;
}

bool get_field_checksum(const json& obj, const char* key, uint32_t* out) {
  std::string s;
  return get_field_string(obj, key, &s) && parse_checksum_hex(s, out);
}

bool get_shape(const json& obj, std::vector<int64_t>* shape) {
  if (!obj.is_object() || !obj.contains("shape") || !obj["shape"].is_array()) return false;
  shape->clear();
  for (const json& d : obj["shape"]) {
    uint64_t v = 0;
    if (!get_uint(d, &v) || v > (uint64_t(1) << 62)) return false;
    shape->push_back(int64_t(v));
  }
  return true;
}

ojson piece_json(const PieceRecord& p) {
  return {{"rank", p.rank},     {"file", p.file},     {"file_offset", p.file_offset},
          {"offset", p.offset}, {"length", p.length}, {"checksum", checksum_hex(p.crc)}};
}

// Parses one piece object; "" or the problem.
std::string parse_piece(const json& j, PieceRecord* p) {
  uint64_t rank = 0;
  if (!get_field_uint(j, "rank", &rank) || rank > (1u << 30)) return "field 'rank' must be a non-negative integer";
  p->rank = int(rank);
  if (!get_field_string(j, "file", &p->file) || !plain_file_name(p->file)) return "field 'file' must be a plain file name";
  if (!get_field_uint(j, "file_offset", &p->file_offset)) return "field 'file_offset' must be a non-negative integer";
  if (!get_field_uint(j, "offset", &p->offset)) return "field 'offset' must be a non-negative integer";
  if (!get_field_uint(j, "length", &p->length) || p->length > (uint64_t(1) << 62))
    return "field 'length' must be a non-negative integer";
  if (!get_field_checksum(j, "checksum", &p->crc)) return "field 'checksum' must be 8 hex digits";
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rank tables

std::string table_to_text(const RankTable& t) {
  json files = json::array();
  for (const FileRecord& f : t.files)
    files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"checksum", checksum_hex(f.crc)}});
  json entries = json::array();
  for (const RankEntry& e : t.entries) {
    json p = json(piece_json(e.piece));
    p["name"] = e.name;
    p["shape"] = e.shape;
    p["group"] = e.group;
    entries.push_back(std::move(p));
  }
  return json({{"rank", t.rank}, {"files", files}, {"entries", entries}}).dump();
}

RankTable table_from_text(const std::string& text, int rank) {
  auto bad = [&](const std::string& what) -> RankTable {
    dist_io::fail_ckpt("the piece table received from rank " + std::to_string(rank) + " is malformed: " + what);
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return bad(e.what());
  }
  RankTable t;
  t.rank = rank;
  if (!j.is_object() || !j.contains("files") || !j["files"].is_array() || !j.contains("entries") ||
      !j["entries"].is_array())
    return bad("expected {rank, files, entries}");
  for (const json& f : j["files"]) {
    FileRecord r;
    uint64_t fr = 0;
    if (!get_field_string(f, "name", &r.name) || !get_field_uint(f, "rank", &fr) ||
        !get_field_uint(f, "bytes", &r.bytes) || !get_field_checksum(f, "checksum", &r.crc))
      return bad("a file entry");
    r.rank = int(fr);
    t.files.push_back(r);
  }
  for (const json& e : j["entries"]) {
    RankEntry r;
    if (!get_field_string(e, "name", &r.name) || !get_field_string(e, "group", &r.group) || !get_shape(e, &r.shape))
      return bad("a piece entry");
    std::string err = parse_piece(e, &r.piece);
    if (!err.empty()) return bad("piece of '" + r.name + "': " + err);
    t.entries.push_back(std::move(r));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Tiling

std::string check_tiling(TensorRecord& t) {
  std::stable_sort(t.pieces.begin(), t.pieces.end(),
                   [](const PieceRecord& a, const PieceRecord& b) { return a.offset < b.offset; });
  const std::string who = "tensor '" + t.name + "' " + shape_text(t.shape) + ": ";
  uint64_t covered = 0;  // [0, covered) is tiled so far
  int last_rank = -1;
  for (const PieceRecord& p : t.pieces) {
    if (p.offset > t.numel || p.length > t.numel - p.offset)
      return who + "the piece of rank " + std::to_string(p.rank) + " at elements [" + std::to_string(p.offset) + ", " +
             std::to_string(p.offset + p.length) + ") lies outside its " + std::to_string(t.numel) + " elements";
    if (p.length == 0) continue;
    if (p.offset > covered)
      return who + "elements [" + std::to_string(covered) + ", " + std::to_string(p.offset) +
             ") are owned by no rank (a gap in the pieces)";
    if (p.offset < covered)
      return who + "elements [" + std::to_string(p.offset) + ", " + std::to_string(std::min(covered, p.offset + p.length)) +
             ") are owned twice (ranks " + std::to_string(last_rank) + " and " + std::to_string(p.rank) +
             "; overlapping pieces)";
    covered = p.offset + p.length;
    last_rank = p.rank;
  }
  if (covered != t.numel)
    return who + "elements [" + std::to_string(covered) + ", " + std::to_string(t.numel) +
           ") are owned by no rank (a gap in the pieces)";
  return "";
}

std::string assemble(const std::vector<RankTable>& tables, std::vector<TensorRecord>* out) {
  out->clear();
  std::map<std::string, size_t> index;
  for (const RankTable& t : tables) {
    for (const RankEntry& e : t.entries) {
      auto it = index.find(e.name);
      if (it == index.end()) {
        TensorRecord rec;
        rec.name = e.name;
        rec.shape = e.shape;
        rec.group = e.group;
        if (!shape_numel(e.shape, &rec.numel))
          return "tensor '" + e.name + "': invalid shape " + shape_text(e.shape) + " (from rank " +
                 std::to_string(t.rank) + ")";
        index[e.name] = out->size();
        out->push_back(std::move(rec));
        it = index.find(e.name);
      }
      TensorRecord& rec = (*out)[it->second];
      if (rec.shape != e.shape)
        return "tensor '" + e.name + "': ranks disagree on its shape (" + shape_text(rec.shape) + " from rank " +
               std::to_string(rec.pieces.empty() ? t.rank : rec.pieces.front().rank) + ", " + shape_text(e.shape) +
               " from rank " + std::to_string(t.rank) + ")";
      if (rec.group != e.group)
        return "tensor '" + e.name + "': ranks disagree on its group ('" + rec.group + "' and '" + e.group +
               "' from rank " + std::to_string(t.rank) + ")";
      rec.pieces.push_back(e.piece);
    }
  }
  for (TensorRecord& rec : *out) {
    std::string err = check_tiling(rec);
    if (!err.empty()) return err;
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Formatting

std::string format_manifest(Manifest m) {
  if (m.created.empty()) m.created = manifest_common::utc_now_iso(&m.created_unix);
  ojson man = ojson::object();
  man["manifest_checksum"] = "00000000";
  man["format"] = kFormatName;
  man["version"] = kVersion;
  man["layout"] = "sharded";
  man["step"] = m.step;
  man["created"] = m.created;
  man["created_unix"] = m.created_unix;
  man["world_size"] = m.world_size;
  man["checksum_algorithm"] = "crc32c";
  if (!m.reshaped_from.is_null()) man["reshaped_from"] = ojson::parse(m.reshaped_from.dump());
  man["meta"] = ojson::parse(m.meta.dump());
  ojson files = ojson::array();
  for (const FileRecord& f : m.files)
    files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"checksum", checksum_hex(f.crc)}});
  man["files"] = std::move(files);
  ojson tensors = ojson::array();
  for (const TensorRecord& t : m.tensors) {
    ojson pieces = ojson::array();
    for (const PieceRecord& p : t.pieces) pieces.push_back(piece_json(p));
    tensors.push_back(
        {{"name", t.name}, {"shape", t.shape}, {"dtype", "F32"}, {"group", t.group}, {"pieces", std::move(pieces)}});
  }
  man["tensors"] = std::move(tensors);
  return manifest_common::format_manifest_text(man);
}

// ---------------------------------------------------------------------------------------------
// Parsing

int peek_version(const std::string& dir) {
  std::string text, err;
  if (!dist_io::read_small_file(dist_io::join(dir, kManifestName), &text, &err)) return -1;
  try {
    json j = json::parse(text);
    uint64_t v = 0;
    if (get_field_uint(j, "version", &v) && v < 1000) return int(v);
  } catch (const json::exception&) {
  }
  return -1;
}

bool read_manifest(const std::string& dir, Manifest* m, json* raw, std::vector<std::string>* problems) {
  const size_t before = problems->size();
  const std::string path = dist_io::join(dir, kManifestName);
  auto problem = [&](const std::string& p) {
    problems->push_back(path + ": " + p);
    return false;
  };
  std::string text, err;
  if (!dist_io::read_small_file(path, &text, &err)) return problem(err + " (not a complete checkpoint)");
  err = manifest_common::check_manifest_checksum(text);
  if (!err.empty()) return problem(err);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return problem(std::string("not valid JSON: ") + e.what());
  }
  if (raw) *raw = j;
  if (!j.is_object()) return problem("expected a JSON object");
  if (!j.contains("format") || j["format"] != kFormatName)
    return problem(std::string("field 'format' must be \"") + kFormatName + "\"");
  uint64_t version = 0;
  if (!get_field_uint(j, "version", &version)) return problem("field 'version' must be a positive integer");
  if (version > uint64_t(kVersion))
    return problem("format version " + std::to_string(version) + " is newer than this zaya reads (" +
                   std::to_string(kVersion) + "); upgrade zaya");
  if (version != uint64_t(kVersion))
    return problem("format version " + std::to_string(version) + " is not the sharded format (version 2)");
  uint64_t step = 0, world = 0;
  if (!get_field_uint(j, "step", &step) || step > (uint64_t(1) << 62))
    return problem("field 'step' must be a non-negative integer");
  m->step = int64_t(step);
  err = manifest_common::check_step_matches_dir(dir, step);
  if (!err.empty()) return problem(err);
  if (!get_field_uint(j, "world_size", &world) || world < 1 || world > 1000000)
    return problem("field 'world_size' must be a positive integer");
  m->world_size = int(world);
  get_field_string(j, "created", &m->created);
  uint64_t cu = 0;
  if (get_field_uint(j, "created_unix", &cu)) m->created_unix = int64_t(cu);
  m->meta = j.contains("meta") ? j["meta"] : json::object();
  m->reshaped_from = j.contains("reshaped_from") ? j["reshaped_from"] : json();
  for (const char* k : {"files", "tensors"})
    if (!j.contains(k) || !j[k].is_array()) return problem(std::string("field '") + k + "' must be an array");

  // Files: one per rank.
  m->files.clear();
  std::map<std::string, size_t> file_index;
  for (size_t i = 0; i < j["files"].size(); ++i) {
    const json& f = j["files"][i];
    FileRecord r;
    uint64_t rank = 0;
    if (!get_field_string(f, "name", &r.name) || !plain_file_name(r.name) || !get_field_uint(f, "rank", &rank) ||
        rank >= world || !get_field_uint(f, "bytes", &r.bytes) || !get_field_checksum(f, "checksum", &r.crc)) {
      problem("files[" + std::to_string(i) + "]: expected {name, rank < world_size, bytes, checksum}");
      continue;
    }
    r.rank = int(rank);
    if (!file_index.emplace(r.name, m->files.size()).second) {
      problem("file '" + r.name + "' is listed twice");
      continue;
    }
    m->files.push_back(r);
  }

  // Tensors.
  m->tensors.clear();
  std::set<std::string> names;
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    const json& t = j["tensors"][i];
    TensorRecord rec;
    std::string dtype;
    if (!get_field_string(t, "name", &rec.name) || rec.name.empty()) {
      problem("tensors[" + std::to_string(i) + "]: field 'name' must be a non-empty string");
      continue;
    }
    const std::string who = "tensor '" + rec.name + "': ";
    if (!names.insert(rec.name).second) {
      problem(who + "listed twice");
      continue;
    }
    if (!get_shape(t, &rec.shape) || !shape_numel(rec.shape, &rec.numel)) {
      problem(who + "field 'shape' must be an array of non-negative integers");
      continue;
    }
    if (!get_field_string(t, "dtype", &dtype) || dtype != "F32") {
      problem(who + "field 'dtype' must be \"F32\"");
      continue;
    }
    if (!get_field_string(t, "group", &rec.group)) rec.group = "params";
    if (!t.contains("pieces") || !t["pieces"].is_array()) {
      problem(who + "field 'pieces' must be an array");
      continue;
    }
    bool ok = true;
    for (size_t k = 0; k < t["pieces"].size() && ok; ++k) {
      PieceRecord p;
      std::string perr = parse_piece(t["pieces"][k], &p);
      if (perr.empty() && uint64_t(p.rank) >= world) perr = "rank " + std::to_string(p.rank) + " >= world_size";
      if (perr.empty()) {
        auto fit = file_index.find(p.file);
        if (fit == file_index.end()) {
          perr = "file '" + p.file + "' is not listed in 'files'";
        } else {
          const FileRecord& f = m->files[fit->second];
          if (p.file_offset > f.bytes || p.length * 4 > f.bytes - p.file_offset)
            perr = "bytes [" + std::to_string(p.file_offset) + ", " + std::to_string(p.file_offset + p.length * 4) +
                   ") lie outside " + p.file + " (" + std::to_string(f.bytes) + " bytes)";
        }
      }
      if (!perr.empty()) {
        problem(who + "pieces[" + std::to_string(k) + "]: " + perr);
        ok = false;
        break;
      }
      rec.pieces.push_back(p);
    }
    if (!ok) continue;
    std::string terr = check_tiling(rec);
    if (!terr.empty()) {
      problem(terr);
      continue;
    }
    m->tensors.push_back(std::move(rec));
  }
  return problems->size() == before;
}

}  // namespace zaya::dist_manifest
