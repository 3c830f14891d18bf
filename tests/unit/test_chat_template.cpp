// Chat templates (data/chat_template.h): the built-ins render their formats exactly, `gemma`
// gives the ids of the Gemma-3 tokenizer's own Jinja chat template (rendered by
// @huggingface/jinja and tokenised by Hugging Face's tokenizers: the committed fixture
// tests/fixtures/chat/gemma3_chat_golden.jsonl), replies and their end tokens are the only
// targets, template files are read with errors naming the file, line and key, message lists and
// conversations a template cannot render are refused with the element named, and
// `zaya data prepare --messages-field --chat-template` writes exactly the rendered documents
// that `zaya eval` scores.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/small_tokenizer.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "data/data_stats.h"
#include "data/document_tokens.h"
#include "data/shard_reader.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "eval/eval_data.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Bytes as ids (byte + 10), BOS 1, EOS 2, and the special tokens below as one id each (300 + k),
// found in text as a tokenizer.json's added tokens are.
class SpecialByteTokenizer final : public Tokenizer {
 public:
  explicit SpecialByteTokenizer(bool with_specials = true, int32_t eos = 2)
      : specials_on_(with_specials), eos_(eos) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    if (add_special) ids.push_back(1);
    size_t i = 0;
    while (i < text.size()) {
      int32_t special = -1;
      for (size_t k = 0; specials_on_ && k < kSpecials.size() && special < 0; ++k)
        if (text.substr(i, kSpecials[k].size()) == kSpecials[k]) special = int32_t(k);
      if (special >= 0) {
        ids.push_back(300 + special);
        i += kSpecials[size_t(special)].size();
      } else {
        ids.push_back(int32_t(static_cast<unsigned char>(text[i++])) + 10);
      }
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id >= 300)
        s += skip_special ? "" : kSpecials[size_t(id - 300)];
      else if (id == 1 || id == 2)
        s += skip_special ? "" : id == 1 ? "<s>" : "</s>";
      else
        s += char(id - 10);
    }
    return s;
  }
  int64_t vocab_size() const override { return 320; }
  int32_t token_to_id(std::string_view) const override { return -1; }
  std::string id_to_token(int32_t id) const override { return std::to_string(id); }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return eos_; }

 private:
  static inline const std::vector<std::string> kSpecials = {
      "<|im_start|>", "<|im_end|>",      "<|start_header_id|>", "<|end_header_id|>",
      "<|eot_id|>",   "<start_of_turn>", "<end_of_turn>"};
  bool specials_on_;
  int32_t eos_;
};

// The target tokens of a rendering as text, one "|"-separated piece per run of targets.
std::string targets_of(const Tokenizer& tok, const ChatTokens& t) {
  std::string out;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= t.ids.size(); ++i) {
    if (i < t.ids.size() && t.target[i]) {
      run.push_back(t.ids[i]);
    } else if (!run.empty()) {
      out += (out.empty() ? "" : "|") + tok.decode(run, false);
      run.clear();
    }
  }
  return out;
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", " And? "}};

using test::expect_error;

TEST(ChatTemplate, BuiltinsRenderTheirFormats) {
  const SpecialByteTokenizer tok;
  struct Want {
    std::string name, prompt;
  };
  const std::vector<Want> wants = {
      {"chatml",
       "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
       "Hello.<|im_end|>\n<|im_start|>user\n And? <|im_end|>\n<|im_start|>assistant\n"},
      {"gemma",  // no system turn: it starts the user's message; every text trimmed
       "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
       "<start_of_turn>user\nAnd?<end_of_turn>\n<start_of_turn>model\n"},
      {"llama3",
       "<s><|start_header_id|>system<|end_header_id|>\n\nBe "
       "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
       "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>"
       "user<|"
       "end_header_id|>\n\nAnd?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"plain", "<s>System: Be brief.\nUser: Hi\nAssistant:Hello.</s>\nUser:  And? \nAssistant:"},
  };
  const std::vector<std::string> ends = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "</s>"};
  ASSERT_EQ(builtin_chat_template_names().size(), wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    SCOPED_TRACE(wants[i].name);
    EXPECT_EQ(builtin_chat_template_names()[i], wants[i].name);
    const ChatFormat chat(load_chat_template(wants[i].name), tok);
    const ChatTokens prompt = chat.render(kConversation, /*for_reply=*/true);
    EXPECT_EQ(tok.decode(prompt.ids, false), wants[i].prompt);
    ASSERT_EQ(prompt.target.size(), prompt.ids.size());
    EXPECT_EQ(targets_of(tok, prompt), "Hello." + ends[i]);  // the earlier reply and its end token

    // Training: the same tokens up to the last reply's end, the messages after it left out.
    const ChatTokens train = chat.render(kConversation, /*for_reply=*/false);
    const std::string text = tok.decode(train.ids, false), reply = "Hello." + ends[i];
    EXPECT_EQ(text, wants[i].prompt.substr(0, wants[i].prompt.find(reply) + reply.size()));
    EXPECT_EQ(train.target.back(), 1);
    EXPECT_EQ(train.ids.back(), chat.end_of_reply_id());
    EXPECT_EQ(targets_of(tok, train), "Hello." + ends[i]);
  }
}

TEST(ChatTemplate, EveryReplyOfAConversationIsATarget) {
  const SpecialByteTokenizer tok;
  const ChatFormat chat(load_chat_template("chatml"), tok);
  const std::vector<ChatMessage> messages = {{"user", "a"},     {"assistant", "b"}, {"user", "c"},
                                             {"assistant", ""}, {"user", "d"},      {"assistant", "e f"}};
  const ChatTokens t = chat.render(messages, false);
  EXPECT_EQ(targets_of(tok, t), "b<|im_end|>|<|im_end|>|e f<|im_end|>");  // an empty reply trains its end
  // Nothing but the replies: the context tokens decode to the template's text and the questions.
  std::vector<int32_t> context;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (!t.target[i]) context.push_back(t.ids[i]);
  EXPECT_EQ(
      tok.decode(context, false),
      "<s><|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n\n<|im_start|>user\nc<|im_end|>\n<|im_start|>"
      "assistant\n\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n");
  // No reply at all: nothing to train.
  EXPECT_TRUE(chat.render({{"user", "a"}}, false).ids.empty());
}

// The built-in gemma template against the Gemma-3 tokenizer's own Jinja template: prompts for
// the next reply are the reference ids exactly; a finished conversation is too, but for the
// newline the template writes after the last end of turn (training ends at the end token).
TEST(ChatTemplate, GemmaGivesTheIdsOfGemma3sJinjaTemplate) {
  const std::string dir = test::gemma_tokenizer_dir();
  const std::string golden = std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/chat/gemma3_chat_golden.jsonl";
  ASSERT_TRUE(fs::exists(dir + "/tokenizer.json")) << "missing " << dir << ": run scripts/setup.sh";
  const auto tok = load_tokenizer(dir + "/tokenizer.json");
  const ChatFormat chat(load_chat_template("gemma"), *tok);
  EXPECT_EQ(chat.end_of_reply_id(), 106);
  EXPECT_EQ(tok->eos_id(), 106);  // tokenizer_config.json: eos_token <end_of_turn>
  std::ifstream in(golden);
  ASSERT_TRUE(in) << "missing " << golden;
  std::string line;
  int lines = 0, finished = 0, bad = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    std::string error;
    const std::vector<ChatMessage> messages = parse_chat_messages(j["messages"], "messages", &error);
    ASSERT_EQ(error, "");
    const bool for_reply = j["add_generation_prompt"].get<bool>();
    std::vector<int32_t> want = j["ids"].get<std::vector<int32_t>>();
    if (!for_reply) {
      ++finished;
      ASSERT_GE(want.size(), 2u);
      ASSERT_EQ(want[want.size() - 2], 106);
      ASSERT_EQ(want.back(), 107);  // "\n"
      want.pop_back();
    }
    const ChatTokens got = chat.render(messages, for_reply);
    if (got.ids != want && ++bad <= 3) ADD_FAILURE() << "line " << lines + 1 << ": " << j["text"].dump();
    // The targets are each reply, trimmed, and its end token.
    std::string replies;
    for (const ChatMessage& m : messages)
      if (m.role == "assistant") {
        std::string c = m.content;
        c.erase(0, c.find_first_not_of(" \t\n\r"));
        c.erase(c.find_last_not_of(" \t\n\r") + 1);
        replies += (replies.empty() ? "" : "|") + c + "<end_of_turn>";
      }
    EXPECT_EQ(targets_of(*tok, got), replies) << "line " << lines + 1;
    ++lines;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << lines << " conversations differ";
  EXPECT_GE(lines, 100);
  EXPECT_GE(finished, 20);
}

TEST(ChatTemplate, TemplateFilesAndTheirErrors) {
  const fs::path dir = fs::temp_directory_path() / ("zaya_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string p = (dir / name).string();
    std::ofstream(p) << text;
    return p;
  };
  const SpecialByteTokenizer tok;
  const std::string good = write("good.toml",
                                 "# a template\n"
                                 "end_of_reply = \"<|im_end|>\"\n"
                                 "trim_content = true\n"
                                 "[system]\nprefix = \"S: \"\nsuffix = \";\"\n"
                                 "[user]\nprefix = \"<|im_start|>U: \"\nsuffix = \"<|im_end|>\"\n"
                                 "[assistant]\nprefix = \"<|im_start|>A: \"\nsuffix = \"~\"\n");
  const ChatFormat chat(load_chat_template(good), tok);
  EXPECT_EQ(chat.chat_template().name, good);
  EXPECT_EQ(tok.decode(chat.render(kConversation, true).ids, false),
            "<s>S: Be brief.;<|im_start|>U: Hi<|im_end|><|im_start|>A: Hello.<|im_end|>~<|im_start|>U: "
            "And?<|im_end|><|im_start|>A: ");

  // A system merged into the next user message, with its own separator; without [system] the
  // default one. No end_of_reply: replies end with EOS.
  const std::string merged = write("merged.toml",
                                   "[system]\nmerge_into_user = true\nseparator = \" | \"\n"
                                   "[user]\nprefix = \"U:\"\n[assistant]\nprefix = \"A:\"\n");
  EXPECT_EQ(tok.decode(ChatFormat(load_chat_template(merged), tok).render(kConversation, true).ids, false),
            "<s>U:Be brief. | HiA:Hello.</s>U: And? A:");
  const std::string bare = write("bare.toml", "[user]\n[assistant]\n");
  EXPECT_EQ(tok.decode(ChatFormat(load_chat_template(bare), tok).render(kConversation, true).ids, false),
            "<s>Be brief.\n\nHiHello.</s> And? ");

  expect_error([&] { load_chat_template(write("typo.toml", "[user]\nprefx = \"U\"\n[assistant]\n")); },
               {"typo.toml:2", "unknown key 'user.prefx'", "prefix, suffix"});
  expect_error([&] { load_chat_template(write("type.toml", "[user]\nprefix = 3\n[assistant]\n")); },
               {"type.toml:2", "'user.prefix' must be a string"});
  expect_error([&] { load_chat_template(write("noassistant.toml", "[user]\n")); },
               {"noassistant.toml", "has no [assistant] table"});
  expect_error([&] { load_chat_template(write("syntax.toml", "[user\n")); },
               {"syntax.toml:1", "TOML syntax error"});
  expect_error(
      [&] { load_chat_template(write("trim.toml", "trim_content = \"yes\"\n[user]\n[assistant]\n")); },
      {"trim.toml:1", "'trim_content' must be true or false"});
  expect_error(
      [&] { load_chat_template(write("sep.toml", "[system]\nseparator = \"-\"\n[user]\n[assistant]\n")); },
      {"sep.toml:2", "applies only with system.merge_into_user = true"});
  expect_error([&] { load_chat_template("nonesuch"); },
               {"'nonesuch' is neither a built-in chat template (chatml, gemma, llama3, plain) nor a file"});
  fs::remove_all(dir);
}

TEST(ChatTemplate, TheEndOfAReplyMustBeOneTokenOfTheTokenizer) {
  const SpecialByteTokenizer no_specials(false);
  expect_error(
      [&] { ChatFormat(load_chat_template("chatml"), no_specials); },
      {"chat template chatml", "\"<|im_end|>\" is not one token of this tokenizer (it encodes to 10 ids)"});
  const SpecialByteTokenizer no_eos(true, -1);
  expect_error([&] { ChatFormat(load_chat_template("plain"), no_eos); },
               {"chat template plain ends replies with EOS, but the tokenizer has none"});
  EXPECT_EQ(ChatFormat(load_chat_template("plain"), no_specials).end_of_reply_id(), 2);
}

TEST(ChatTemplate, ConversationsATemplateCannotRenderAreRefused) {
  const SpecialByteTokenizer tok;
  const ChatFormat chatml(load_chat_template("chatml"), tok), gemma(load_chat_template("gemma"), tok);
  EXPECT_EQ(chatml.check({}, true), "messages: expected at least one message");
  EXPECT_EQ(chatml.check({}, false), "");
  EXPECT_EQ(chatml.check({{"user", "a"}, {"tool", "b"}}, true),
            "messages[1].role: expected \"system\", \"user\" or \"assistant\", got \"tool\"");
  EXPECT_EQ(chatml.check({{"user", "a"}, {"assistant", "b"}}, true),
            "messages[1].role: the last message is the assistant's; the reply is what the model writes next");
  EXPECT_EQ(chatml.check({{"user", "a"}, {"assistant", "b"}}, false), "");
  EXPECT_NE(gemma.check({{"system", "a"}, {"assistant", "b"}}, false, "chat")
                .find("chat[1].role: chat template gemma has no system turn"),
            std::string::npos);
  EXPECT_NE(gemma.check({{"user", "a"}, {"system", "b"}}, true).find("but none follows it"),
            std::string::npos);
  EXPECT_EQ(chatml.check({{"user", "a"}, {"system", "b"}}, true), "");
  expect_error([&] { chatml.render({{"assistant", "b"}}, true); }, {"messages[0].role: the last message"});
}

TEST(ChatTemplate, MessageListsAreReadFromJson) {
  std::string error;
  const std::vector<ChatMessage> m =
      parse_chat_messages(json::parse(R"([{"role": "user", "content": "a", "name": "x"},
                      {"role": "assistant", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}])"),
                          "messages", &error);
  EXPECT_EQ(error, "");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[0].content, "a");
  EXPECT_EQ(m[1].content, "bc");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"role": "user"})", "msgs: expected an array of messages, got object"},
      {R"(["hi"])", "msgs[0]: expected an object with a role and a content, got string"},
      {R"([{"content": "a"}])",
       "msgs[0].role: expected a string (\"system\", \"user\" or \"assistant\"), got nothing"},
      {R"([{"role": 1, "content": "a"}])",
       "msgs[0].role: expected a string (\"system\", \"user\" or \"assistant\"), got number"},
      {R"([{"role": "user"}])", "msgs[0].content: missing"},
      {R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": null}])",
       "msgs[1].content: expected a string or an array of text parts, got null"},
      {R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])",
       "msgs[0].content[0]: expected a text part {\"type\": \"text\", \"text\": ...} (only text is "
       "supported), got "
       "type \"image_url\""},
      {R"([{"role": "user", "content": [{"type": "text"}]}])", "msgs[0].content[0].text: expected a string"},
  };
  for (const auto& [text, want] : bad) {
    EXPECT_TRUE(parse_chat_messages(json::parse(text), "msgs", &error).empty()) << text;
    EXPECT_EQ(error, want) << text;
  }
}

// `zaya data prepare --messages-field --chat-template`: each record is its messages as the
// template renders them for training (then EOS, unless the last reply ended with it), replies
// the only targets; `zaya eval` reads the same JSONL to the same tokens and targets.
TEST(ChatTemplate, PrepareWritesTheRenderedConversationsAndEvalReadsThemAlike) {
  const fs::path dir = fs::temp_directory_path() / ("zaya_chat_prepare_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tokenizer = test::train_small_tokenizer((dir / "tok").string());
  const std::string input = (dir / "chats.jsonl").string();
  const std::vector<std::vector<ChatMessage>> chats = {
      {{"system", "Birds fly south."}, {"user", "The cat sat on the"}, {"assistant", "mat."}},
      {{"user", "A dog ran"}, {"assistant", "in the park."}, {"user", "The cat?"}, {"assistant", "It sat."}},
      {{"user", "No reply here"}},  // nothing to train: skipped
      {{"user", "The mat"}, {"assistant", "The park."}, {"user", "left out: no reply follows"}},
  };
  {
    std::ofstream out(input);
    for (const auto& chat : chats) {
      json messages = json::array();
      for (const ChatMessage& m : chat) messages.push_back({{"role", m.role}, {"content", m.content}});
      out << json{{"id", 7}, {"conversation", messages}}.dump() << "\n";
    }
  }
  PrepareOptions o;
  o.tokenizer = tokenizer;
  o.inputs = {input};
  o.out_dir = (dir / "out").string();
  o.messages_field = "conversation";
  o.chat_template = "plain";
  o.threads = 2;
  const PrepareResult result = prepare_shards(o);

  const auto tok = load_tokenizer(tokenizer);
  const ChatFormat plain(load_chat_template("plain"), *tok);
  std::vector<uint32_t> want_tokens;
  std::vector<uint8_t> want_mask;
  for (const auto& chat : chats) {
    const ChatTokens t = plain.render(chat, false);
    if (t.ids.empty()) continue;
    EXPECT_EQ(t.ids.back(), tok->eos_id());  // plain ends replies with EOS: no second one
    want_tokens.insert(want_tokens.end(), t.ids.begin(), t.ids.end());
    want_mask.insert(want_mask.end(), t.target.begin(), t.target.end());
  }
  EXPECT_EQ(result.documents, 3u);
  EXPECT_EQ(result.skipped, 1u);
  ASSERT_EQ(result.tokens, want_tokens.size());
  const ShardDataset ds = ShardDataset::open(o.out_dir, {});
  ASSERT_TRUE(ds.has_loss_mask());
  EXPECT_EQ(ds.manifest().messages_field, "conversation");
  EXPECT_EQ(ds.manifest().chat_template, "plain");
  EXPECT_EQ(ds.manifest().prompt_field, "");
  std::vector<uint32_t> got_tokens(want_tokens.size());
  std::vector<uint8_t> got_mask(want_tokens.size());
  ds.read(0, got_tokens.size(), got_tokens.data());
  ds.read_loss_mask(0, got_mask.size(), got_mask.data());
  EXPECT_EQ(got_tokens, want_tokens);
  EXPECT_EQ(got_mask, want_mask);
  EXPECT_NE(format_data_stats(compute_data_stats(o.out_dir), nullptr).find("the assistant's replies"),
            std::string::npos);

  EvalDataOptions eo;
  eo.messages_field = "conversation";
  eo.chat_template = "plain";
  const EvalTokens ev = load_eval_tokens({input}, tok.get(), eo);
  EXPECT_EQ(ev.tokens.size(), want_tokens.size());
  EXPECT_TRUE(std::equal(want_tokens.begin(), want_tokens.end(), ev.tokens.begin(),
                         [](uint32_t a, auto b) { return int64_t(a) == int64_t(b); }));
  EXPECT_EQ(ev.target_mask, want_mask);
  EXPECT_EQ(ev.documents, 3u);

  // A template that ends replies with a token other than EOS: EOS follows each document as a
  // separator, not a target.
  std::vector<uint32_t> sep_tokens;
  std::vector<uint8_t> sep_mask;
  const SpecialByteTokenizer special_tok;
  const ChatFormat chatml(load_chat_template("chatml"), special_tok);
  ASSERT_TRUE(append_chat_document(chatml, chats[0], "messages", 2, 320, "x", sep_tokens, sep_mask));
  EXPECT_EQ(sep_tokens.back(), 2u);
  EXPECT_EQ(sep_mask.back(), 0);
  EXPECT_EQ(sep_tokens[sep_tokens.size() - 2], uint32_t(chatml.end_of_reply_id()));
  EXPECT_EQ(sep_mask[sep_mask.size() - 2], 1);

  // Errors name the file, line and element; the options come in pairs.
  {
    std::ofstream(input) << json{{"conversation", {{{"role", "user"}, {"content", "a"}}}}}.dump() << "\n"
                         << json{{"conversation", {{{"role", "bot"}, {"content", "a"}}}}}.dump() << "\n";
  }
  expect_error(
      [&] { prepare_shards(o); },
      {"chats.jsonl:2", "conversation[0].role: expected \"system\", \"user\" or \"assistant\", got \"bot\""});
  { std::ofstream(input) << json{{"messages", json::array()}}.dump() << "\n"; }
  expect_error([&] { prepare_shards(o); }, {"chats.jsonl:1", "no field 'conversation'", "--messages-field"});
  PrepareOptions half = o;
  half.chat_template = "";
  expect_error([&] { prepare_shards(half); }, {"--chat-template is missing"});
  PrepareOptions both = o;
  both.prompt_field = "p";
  both.completion_field = "c";
  expect_error([&] { prepare_shards(both); }, {"two kinds of record"});
  PrepareOptions wrong = o;
  wrong.chat_template = "chatml";  // its end token is not one token of the SentencePiece vocabulary
  expect_error([&] { prepare_shards(wrong); }, {"is not one token of this tokenizer"});
  expect_error([&] { load_eval_tokens({o.out_dir}, tok.get(), eo); },
               {"--messages-field and --chat-template apply to JSONL text, not to a shard directory"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya
