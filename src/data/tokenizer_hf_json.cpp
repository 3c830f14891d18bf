// tokenizer.json in one pass (see the header): nlohmann's parser with a callback that hands
// model.vocab's entries and model.merges' elements to flat lists and keeps them out of the
// document. The callback's depth counts the containers around an event: keys and values of the
// top-level object are at 1, model's keys at 2, vocab's entries and merges' elements at 3.
// A key the callback drops also drops its value without storing it, and a value the callback
// drops is never stored. A container under a kept key (or in an array) is dropped at its end,
// after its elements were seen; one under a dropped key (a vocab entry's value) is never stored
// and gets no end event, so it is recorded at its start.
#include "data/tokenizer_hf_json.h"

#include <climits>

namespace zaya::tok {

using nlohmann::json;

namespace {

class BpeEntriesCollector {
 public:
  explicit BpeEntriesCollector(BpeEntries& out) : out_(out) {}

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    if (event == Event::key && depth == 1) {
      top_key_ = parsed.get_ref<const std::string&>();
      if (top_key_ == "model") out_ = BpeEntries{};  // a repeated "model" replaces the earlier one
    } else if (event == Event::object_start && depth == 1) {
      in_model_ = top_key_ == "model";
    } else if (event == Event::object_end && depth == 1) {
      in_model_ = false;
    } else if (event == Event::key && depth == 2 && in_model_) {
      model_key_ = parsed.get_ref<const std::string&>();
      // A repeated key replaces the earlier value, as in a parsed document.
      if (model_key_ == "vocab") out_.vocab_is_object = false, out_.vocab.clear();
      if (model_key_ == "merges") out_.merges_is_array = false, out_.merges.clear();
    } else if (depth == 2 && in_model_ && event == Event::object_start && model_key_ == "vocab") {
      out_.vocab_is_object = true;
      in_ = Section::Vocab;
    } else if (depth == 2 && in_model_ && event == Event::array_start && model_key_ == "merges") {
      out_.merges_is_array = true;
      in_ = Section::Merges;
    } else if (depth == 2 && (event == Event::object_end || event == Event::array_end)) {
      in_ = Section::None;
    } else if (in_ == Section::Vocab) {
      return vocab_event(depth, event, parsed);
    } else if (in_ == Section::Merges) {
      return merges_event(depth, event, parsed);
    }
    return true;
  }

 private:
  enum class Section { None, Vocab, Merges };

  bool vocab_event(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    if (depth != 3) return true;  // inside an entry's (invalid) container: never stored
    if (event == Event::key) {
      token_ = std::move(parsed.get_ref<std::string&>());
      return false;
    }
    if (event == Event::value) {
      out_.vocab.emplace_back(std::move(token_), token_id_or_invalid(parsed));
      return false;
    }
    if (event == Event::object_start || event == Event::array_start)
      out_.vocab.emplace_back(std::move(token_), -1);
    return true;
  }

  bool merges_event(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    using Form = BpeEntries::Merge::Form;
    if (depth == 3) {
      switch (event) {
        case Event::value: {
          BpeEntries::Merge m;
          if (parsed.is_string()) m.form = Form::Text, m.a = std::move(parsed.get_ref<std::string&>());
          out_.merges.push_back(std::move(m));
          return false;
        }
        case Event::array_start:
          pair_.clear();
          pair_valid_ = true;
          return true;
        case Event::array_end: {
          BpeEntries::Merge m;
          if (pair_valid_ && pair_.size() == 2)
            m.form = Form::Pair, m.a = std::move(pair_[0]), m.b = std::move(pair_[1]);
          out_.merges.push_back(std::move(m));
          return false;
        }
        case Event::object_start:
          out_.merges.emplace_back();  // Invalid
          return true;
        case Event::object_end:
          return false;
        default:
          return true;
      }
    }
    if (depth == 4 && event == Event::value) {  // an element of a pair
      if (parsed.is_string() && pair_.size() < 2)
        pair_.push_back(std::move(parsed.get_ref<std::string&>()));
      else
        pair_valid_ = false;
      return false;
    }
    if (depth == 4 && (event == Event::object_start || event == Event::array_start)) pair_valid_ = false;
    return true;
  }

  BpeEntries& out_;
  std::string top_key_, model_key_, token_;
  bool in_model_ = false;
  Section in_ = Section::None;
  std::vector<std::string> pair_;
  bool pair_valid_ = false;
};

}  // namespace

int32_t token_id_or_invalid(const json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= INT32_MAX ? static_cast<int32_t>(v.get<uint64_t>()) : -1;
  if (v.is_number_integer()) {
    const int64_t id = v.get<int64_t>();
    return id >= 0 && id <= INT32_MAX ? static_cast<int32_t>(id) : -1;
  }
  return -1;
}

TokenizerJson parse_tokenizer_json(const std::string& text) {
  TokenizerJson out;
  BpeEntriesCollector collector(out.bpe);
  out.doc = json::parse(text, [&collector](int depth, json::parse_event_t event, json& parsed) {
    return collector(depth, event, parsed);
  });
  return out;
}

}  // namespace zaya::tok
