// Post-processor parsing (TemplateProcessing, Bert/Roberta, ByteLevel, Sequence); included by
// tokenizer_hf_pipeline.h because it is templated on the token lookup.
#pragma once
#include "core/error.h"

namespace zaya::tok {

template <class F>
void parse_post_into(const nlohmann::json& j, const std::string& file, F token_id, PostTemplate& out) {
  if (j.is_null()) return;
  std::string type = j.value("type", std::string());
  auto where = [&] { return file + ": post_processor '" + type + "'"; };
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", nlohmann::json::array())) parse_post_into(p, file, token_id, out);
    return;
  }
  if (type == "ByteLevel") return;  // only trims offsets; ids unchanged
  if (type == "TemplateProcessing") {
    const auto& single = j.at("single");
    const auto& specials = j.value("special_tokens", nlohmann::json::object());
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
          ids = specials[name]["ids"].template get<std::vector<int32_t>>();
        } else {
          int32_t id = token_id(name);
          if (id < 0) fail("tokenizer", where() + ": special token '" + name + "' is unknown");
          ids.push_back(id);
        }
        auto& dst = seen_a ? out.after : out.before;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        fail("tokenizer", where() + ": template item " + item.dump() + " is not understood");
      }
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    out = PostTemplate{};
    out.present = true;
    out.before.push_back(j.at("cls").at(1).template get<int32_t>());
    out.after.push_back(j.at("sep").at(1).template get<int32_t>());
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
