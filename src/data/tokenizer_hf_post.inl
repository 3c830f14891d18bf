// Post-processor parsing (TemplateProcessing, Bert/Roberta, ByteLevel, Sequence); included by
// tokenizer_hf_pipeline.h because it is templated on the token lookup.
#pragma once
#include <climits>
#include <string>
#include "core/error.h"
#include "data/tokenizer_hf_json.h"

namespace zaya::tok {

// An id from the file: an integer in [0, INT32_MAX] (token_id_or_invalid), or an error naming it.
inline int32_t post_processor_id(const nlohmann::json& v, const std::string& where) {
  const int32_t id = token_id_or_invalid(v);
  if (id < 0)
    fail("tokenizer", where + ": id " + (v.is_structured() ? std::string(v.type_name()) : v.dump()) +
                          " must be an integer in [0, " + std::to_string(INT32_MAX) + "]");
  return id;
}

template <class F>
void parse_post_into(const nlohmann::json& j, const std::string& file, F token_id, PostTemplate& out) {
  if (j.is_null()) return;
  std::string type = j.value("type", std::string());
  auto where = [&] { return file + ": post_processor '" + type + "'"; };
  if (type == "Sequence") {
    if (const auto it = j.find("processors"); it != j.end())  // read in place: a copy recurses
      for (const auto& p : *it) parse_post_into(p, file, token_id, out);
    return;
  }
  if (type == "ByteLevel") return;  // only trims offsets; ids unchanged
  if (type == "TemplateProcessing") {
    const auto& single = j.at("single");
    static const nlohmann::json kNoSpecialTokens = nlohmann::json::object();
    const auto specials_it = j.find("special_tokens");
    const nlohmann::json& specials = specials_it == j.end() ? kNoSpecialTokens : *specials_it;
    bool seen_a = false;
    out = PostTemplate{};
    out.present = true;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        std::string which = item["Sequence"].value("id", std::string("A"));
        if (which != "A") fail("tokenizer", where() + ": single template uses sequence '" + which + "'");
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        std::string name = item["SpecialToken"].value("id", std::string());
        std::vector<int32_t> ids;
        if (specials.contains(name) && specials[name].contains("ids")) {
          const nlohmann::json& listed = specials[name]["ids"];
          if (!listed.is_array()) fail("tokenizer", where() + ": special token '" + name + "' ids must be an array");
          for (const auto& v : listed) ids.push_back(post_processor_id(v, where()));
        } else {
          int32_t id = token_id(name);
          if (id < 0) fail("tokenizer", where() + ": special token '" + name + "' is unknown");
          ids.push_back(id);
        }
        auto& dst = seen_a ? out.after : out.before;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        fail("tokenizer", where() + ": template item " + (item.is_structured() ? std::string(item.type_name()) : item.dump()) +
                              " is not understood");
      }
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    out = PostTemplate{};
    out.present = true;
    out.before.push_back(post_processor_id(j.at("cls").at(1), where()));
    out.after.push_back(post_processor_id(j.at("sep").at(1), where()));
    return;
  }
  fail("tokenizer", file + ": post_processor type '" + type + "' is not supported",
       "supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence");
}

template <class F>
PostTemplate parse_post_processor(const nlohmann::json& j, const std::string& file, F token_id) {
  PostTemplate out;
  try {
    parse_post_into(j, file, token_id, out);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer", file + ": post_processor: " + e.what());
  }
  return out;
}

}  // namespace zaya::tok
