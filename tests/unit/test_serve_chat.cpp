// POST /v1/chat/completions (docs/serving.md): a chat completion is the completion of the
// conversation as the server's chat template renders it (the same ids and logprobs as
// /v1/completions given those ids, the text decoded from the reply's ids alone), in OpenAI's chat shapes,
// whole and streamed (a role chunk, content deltas, a finish chunk, and the usage chunk that stream_options
// asks for); a template's end of reply ends generation as EOS does; bad requests are 400s naming the field.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/chat_template.h"
#include "serve/chat_session.h"
#include "serve/completion_run.h"
#include "serve_http_fixture.h"

namespace zaya::serve_test {
namespace {

const json kMessages = json::array({{{"role", "system"}, {"content", "Numbers like 12345."}},
                                    {{"role", "user"}, {"content", "The quick brown fox"}},
                                    {{"role", "assistant"}, {"content", "jumps over the lazy dog."}},
                                    {{"role", "user"}, {"content", "A tokenizer turns text"}}});

std::vector<int32_t> rendered_prompt(const Tokenizer& tok, const json& messages) {
  std::string error;
  const std::vector<ChatMessage> m = parse_chat_messages(messages, "messages", &error);
  EXPECT_EQ(error, "");
  return ChatFormat(load_chat_template("plain"), tok).render(m, true).ids;
}

TEST_F(ServeHttp, ChatCompletionIsTheCompletionOfTheRenderedConversation) {
  const std::vector<int32_t> prompt = rendered_prompt(*tok_, kMessages);
  for (const double temperature : {0.0, 0.9}) {
    SCOPED_TRACE(temperature);
    Reply chat = post("/v1/chat/completions", json{{"messages", kMessages},
                                                   {"max_tokens", 16},
                                                   {"temperature", temperature},
                                                   {"seed", 5},
                                                   {"model", "anything"}});
    ASSERT_EQ(chat.status, 200) << chat.raw;
    Reply plain =
        post("/v1/completions",
             json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", temperature}, {"seed", 5}});
    ASSERT_EQ(plain.status, 200) << plain.raw;
    EXPECT_EQ(chat.body.at("object"), "chat.completion");
    EXPECT_EQ(chat.body.at("id").get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(chat.body.at("model"), "tiny-test");
    const json& c = chat.body.at("choices").at(0);
    const json& p = plain.body.at("choices").at(0);
    EXPECT_EQ(c.at("message").at("role"), "assistant");
    // The reply's text is its ids decoded on their own, as the template tokenises a reply.
    EXPECT_EQ(c.at("message").at("content"), tok_->decode(ids_of(p), true));
    EXPECT_EQ(c.at("token_ids"), p.at("token_ids"));
    EXPECT_EQ(c.at("finish_reason"), p.at("finish_reason"));
    EXPECT_TRUE(c.at("logprobs").is_null());
    EXPECT_EQ(chat.body.at("usage"), plain.body.at("usage"));
    EXPECT_EQ(chat.body["usage"]["prompt_tokens"], prompt.size());
  }
  // Without max_tokens the reply may use the rest of the context.
  Reply open = post("/v1/chat/completions", json{{"messages", kMessages}, {"temperature", 0}});
  ASSERT_EQ(open.status, 200) << open.raw;
  const int64_t context = model_->config().max_position_embeddings;
  const json& usage = open.body.at("usage");
  if (open.body["choices"][0]["finish_reason"] == "length")
    EXPECT_EQ(usage.at("total_tokens").get<int64_t>(), context);
  else
    EXPECT_LT(usage.at("total_tokens").get<int64_t>(), context);
  EXPECT_EQ(usage.at("completion_tokens"), open.body["choices"][0]["token_ids"].size());
}

TEST_F(ServeHttp, StreamedChatChunksConcatenateToTheWholeReply) {
  json body = {{"messages", kMessages}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 2}, {"n", 2}};
  Reply whole = post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  ASSERT_EQ(whole.body.at("choices").size(), 2u);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.content_type.rfind("text/event-stream", 0), 0u);
  const std::vector<std::string> events = sse_data(r.raw);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::string> content(2);
  std::vector<std::vector<int32_t>> ids(2);
  std::vector<json> finish(2);
  std::vector<int> role_chunks(2, 0);
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk.at("object"), "chat.completion.chunk");
    EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null()) << "include_usage: null until the last";
    const json& choice = chunk.at("choices").at(0);
    const size_t index = choice.at("index").get<size_t>();
    ASSERT_LT(index, 2u);
    const json& delta = choice.at("delta");
    if (delta.contains("role")) {
      EXPECT_EQ(delta, json({{"role", "assistant"}, {"content", ""}}));
      EXPECT_TRUE(content[index].empty() && ids[index].empty()) << "the role chunk comes first";
      ++role_chunks[index];
    } else if (!choice.at("finish_reason").is_null()) {
      EXPECT_EQ(delta, json::object());
      finish[index] = choice["finish_reason"];
    } else {
      EXPECT_TRUE(finish[index].is_null()) << "a delta after the finish chunk";
      content[index] += delta.at("content").get<std::string>();
    }
    for (int32_t id : choice.at("token_ids").get<std::vector<int32_t>>()) ids[index].push_back(id);
  }
  for (size_t k = 0; k < 2; ++k) {
    const json& c = whole.body["choices"][k];
    EXPECT_EQ(role_chunks[k], 1);
    EXPECT_EQ(content[k], c["message"]["content"].get<std::string>()) << k;
    EXPECT_EQ(json(ids[k]), c["token_ids"]) << k;
    EXPECT_EQ(finish[k], c["finish_reason"]) << k;
  }
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last.at("choices"), json::array());
  EXPECT_EQ(last.at("usage"), whole.body.at("usage"));

  // Without stream_options, no usage chunk: the last event before [DONE] is a finish chunk.
  body.erase("stream_options");
  const std::vector<std::string> plain = sse_data(post("/v1/chat/completions", body).raw);
  ASSERT_GE(plain.size(), 2u);
  const json final_chunk = json::parse(plain[plain.size() - 2]);
  EXPECT_FALSE(final_chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(final_chunk.contains("usage"));
}

TEST_F(ServeHttp, ChatLogprobsAreTheCompletionsLogprobsInChatForm) {
  const std::vector<int32_t> prompt = rendered_prompt(*tok_, kMessages);
  Reply chat = post("/v1/chat/completions", json{{"messages", kMessages},
                                                 {"max_tokens", 6},
                                                 {"temperature", 0},
                                                 {"logprobs", true},
                                                 {"top_logprobs", 2}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  Reply plain = post("/v1/completions",
                     json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(plain.status, 200) << plain.raw;
  const json& content = chat.body["choices"][0].at("logprobs").at("content");
  const json& lp = plain.body["choices"][0].at("logprobs");
  ASSERT_EQ(content.size(), lp.at("tokens").size());
  ASSERT_GT(content.size(), 0u);
  std::string joined;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& e = content[j];
    joined += e.at("token").get<std::string>();
    EXPECT_EQ(e.at("logprob"), lp["token_logprobs"][j]);
    std::vector<int> bytes;
    for (unsigned char ch : e["token"].get<std::string>()) bytes.push_back(ch);
    EXPECT_EQ(e.at("bytes"), json(bytes));
    // The same alternatives (named as the reply's text names tokens, so compared by value).
    std::vector<double> chat_values, plain_values;
    for (const json& t : e.at("top_logprobs")) chat_values.push_back(t.at("logprob").get<double>());
    for (const auto& [name, value] : lp["top_logprobs"][j].items())
      plain_values.push_back(value.get<double>());
    std::sort(chat_values.begin(), chat_values.end());
    std::sort(plain_values.begin(), plain_values.end());
    EXPECT_EQ(chat_values, plain_values) << j;
  }
  EXPECT_EQ(joined, chat.body["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(ServeHttp, BadChatRequestsAre400NamingTheField) {
  const json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  const std::vector<std::pair<json, std::string>> cases = {
      {json::object(), "messages: required"},
      {{{"messages", "hi"}}, "messages: expected an array of messages, got string"},
      {{{"messages", json::array({{{"role", "user"}}})}}, "messages[0].content: missing"},
      {{{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}},
       "messages[0].role: expected \"system\", \"user\" or \"assistant\", got \"robot\""},
      {{{"messages",
         json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}})}},
       "messages[1].role: the last message is the assistant's"},
      {{{"messages", json::array()}}, "messages: expected at least one message"},
      {{{"messages", user}, {"max_tokens", 0}}, "max_tokens: expected an integer >= 1, got 0"},
      {{{"messages", user}, {"max_completion_tokens", 100000}}, "max_completion_tokens: the messages ("},
      {{{"messages", user}, {"max_tokens", std::numeric_limits<int64_t>::max()}}, "max_tokens: the messages ("},
      {{{"messages", user}, {"temperature", "hot"}}, "temperature: expected a number >= 0"},
      {{{"messages", user}, {"top_logprobs", 2}}, "top_logprobs: needs \"logprobs\": true"},
      {{{"messages", user}, {"logprobs", true}, {"top_logprobs", 21}},
       "top_logprobs: expected an integer in [0, 20]"},
      {{{"messages", user}, {"stream_options", {{"include_usage", true}}}},
       "stream_options: applies only with"},
      {{{"messages", user}, {"tools", json::array({{{"type", "function"}}})}},
       "tools: tool calls are not supported"},
      {{{"messages", user}, {"response_format", {{"type", "json_object"}}}},
       "response_format: only {\"type\": \"text\"}"},
  };
  for (const auto& [body, want] : cases) {
    Reply r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(want), std::string::npos)
        << "want '" << want << "' in " << r.raw;
  }
  // Accepted at their defaults.
  Reply ok = post("/v1/chat/completions", json{{"messages", user},
                                               {"max_tokens", 1},
                                               {"tools", json::array()},
                                               {"response_format", {{"type", "text"}}}});
  EXPECT_EQ(ok.status, 200) << ok.raw;
  Reply get_chat = get("/v1/chat/completions");
  EXPECT_EQ(get_chat.status, 405);
  EXPECT_EQ(get("/v1/models").body["data"][0].at("chat_template"), "plain");
}

TEST(ServeChatSetup, AServerWithoutATemplateOrTokenizerSaysSo) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  ServerOptions so;
  so.port = 0;
  so.log_requests = false;
  HttpServer server(*model, nullptr, so);
  server.start();
  httplib::Client c("127.0.0.1", server.port());
  auto r = c.Post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("messages: this server has no chat template; start it with --chat-template"),
            std::string::npos)
      << r->body;
  EXPECT_TRUE(json::parse(c.Get("/v1/models")->body)["data"][0].at("chat_template").is_null());
  server.stop();
  so.chat_template = "plain";
  try {
    HttpServer no_tokenizer(*model, nullptr, so);
    ADD_FAILURE() << "a chat template without a tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template plain needs a tokenizer"), std::string::npos)
        << e.what();
  }
}

// A chat template's end of reply (CompletionJob::end_ids) ends generation where it is sampled,
// as EOS does: not included, finish_reason "stop".
TEST(ServeChatSetup, AnEndOfReplyIdEndsTheCompletionAsEosDoes) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  CompletionJob job;
  job.prompt = kPrompt;
  job.max_tokens = 10;
  job.sampling.temperature = 0;
  auto emit = [](CompletionChunk) { return true; };
  const CompletionResult free_run = run_completion(*model, nullptr, job, emit);
  ASSERT_EQ(free_run.ids.size(), 10u);
  const size_t k = 4;
  const auto first = std::find(free_run.ids.begin(), free_run.ids.end(), free_run.ids[k]);
  job.end_ids = {free_run.ids[k]};
  const CompletionResult ended = run_completion(*model, nullptr, job, emit);
  EXPECT_EQ(ended.ids, std::vector<int32_t>(free_run.ids.begin(), first));
  EXPECT_EQ(ended.finish_reason, "stop");
}

// A chat reply's text is its ids decoded alone, and its logprobs name the alternatives the same
// way: the first token of a reply after "Assistant:" is "word", not " word", in both places.
TEST(ServeChatSetup, AReplysAlternativesAreNamedAsItsTokensAre) {
  const fs::path dir = make_temp_dir("chat_names");
  const auto tok = train_small_tokenizer(dir);
  std::vector<int32_t> word_id;
  std::string word;
  for (const char* w : {"The", "the", "quick", "brown", "model", "text"}) {
    word_id = tok->encode(w);
    word = w;
    if (word_id.size() == 1) break;
  }
  ASSERT_EQ(word_id.size(), 1u);
  const ModelConfig config = preset_config("zaya-tiny");
  CompletionJob job;
  job.prompt = tok->encode("User: hi\nAssistant:", true);
  job.max_tokens = 2;
  job.sampling.temperature = 0;
  job.logprobs = 2;
  std::vector<float> logits(size_t(config.vocab_size), 0.0f);
  logits[size_t(word_id[0])] = 5;  // the likeliest: chosen, and first among the alternatives
  for (const bool alone : {true, false}) {
    job.text_alone = alone;
    CompletionRun run(config, tok.get(), job, [](CompletionChunk) { return true; });
    ASSERT_EQ(run.step(logits.data()), word_id[0]);
    run.step(logits.data());
    const CompletionResult r = run.finish();
    const std::string name = alone ? word : " " + word;
    EXPECT_EQ(r.text, name + " " + word) << alone;
    ASSERT_TRUE(r.logprobs && r.logprobs->size() == 2u);
    const LogprobEntry& first = (*r.logprobs)[0];
    EXPECT_EQ(first.token, name);
    ASSERT_TRUE(first.top.has_value());
    EXPECT_EQ((*first.top)[0].first, name) << "the chosen token among its alternatives, named alike";
  }
  fs::remove_all(dir);
}

// `zaya chat`'s session: each reply is what generate() gives the rendered conversation; a turn
// whose tokens extend what the decode state holds prefills only the rest, and continuing the
// state gives the reply a fresh prefill gives.
TEST_F(ServeHttp, ChatSessionContinuesItsStateTurnByTurn) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const ChatFormat plain(load_chat_template("plain"), *tok_);
  ChatSession session(*model, *tok_, plain);
  EXPECT_EQ(session.context(), model->config().max_position_embeddings);
  session.add("system", "Numbers like 12345.");
  const SamplingParams greedy{0.0f, 0, 1.0f};
  // The first reply is one word-start piece over and over (a logit bias), so that it
  // re-tokenises to its ids: a SentencePiece tokenizer gives a reply that starts mid-word a
  // word-start piece of its own, which the random model does not generate.
  SamplingParams words = greedy;
  for (const char* w : {"The", "the", "quick", "brown", "model", "text"})
    if (tok_->encode(w).size() == 1) {
      words.logit_bias = {{tok_->encode(w)[0], 100.0f}};
      break;
    }
  ASSERT_FALSE(words.logit_bias.empty());
  std::string streamed;
  const ChatSession::Turn t1 =
      session.say("The quick brown fox", words, 0, 12, [&](const std::string& piece) { streamed += piece; });
  std::vector<ChatMessage> m = {{"system", "Numbers like 12345."}, {"user", "The quick brown fox"}};
  const std::vector<int32_t> prompt1 = plain.render(m, true).ids;
  EXPECT_EQ(t1.prompt_tokens, int64_t(prompt1.size()));
  EXPECT_EQ(t1.prefilled, int64_t(prompt1.size()));
  EXPECT_EQ(t1.ids, reference(prompt1, 12, words, 0));
  EXPECT_EQ(t1.reply, tok_->decode(t1.ids, true));
  EXPECT_EQ(streamed, t1.reply);
  EXPECT_EQ(t1.finish_reason, t1.ids.size() == 12 ? "length" : "stop");

  const ChatSession::Turn t2 = session.say("A tokenizer turns text", greedy, 1, 12);
  m.push_back({"assistant", t1.reply});
  m.push_back({"user", "A tokenizer turns text"});
  const std::vector<int32_t> prompt2 = plain.render(m, true).ids;
  EXPECT_EQ(t2.prompt_tokens, int64_t(prompt2.size()));
  // The state holds the first prompt and the reply but its last token when max_tokens cut it
  // (sampled, never fed); the second prompt extends those tokens, as the reply re-tokenises to
  // its ids.
  std::vector<int32_t> fed = prompt1;
  fed.insert(fed.end(), t1.ids.begin(), t1.ids.end() - (t1.finish_reason == "length" ? 1 : 0));
  ASSERT_TRUE(prompt2.size() > fed.size() && std::equal(fed.begin(), fed.end(), prompt2.begin()))
      << "reply " << json(t1.ids) << " \"" << t1.reply << "\" re-tokenises to "
      << json(tok_->encode(t1.reply));
  EXPECT_EQ(t2.prefilled, int64_t(prompt2.size() - fed.size()));
  EXPECT_EQ(t2.ids, reference(prompt2, 12, greedy, 1));
  ASSERT_EQ(session.messages().size(), 5u);
  EXPECT_EQ(session.messages()[4].content, t2.reply);

  // Starting over keeps the system message and runs the whole prompt again.
  session.reset();
  ASSERT_EQ(session.messages().size(), 1u);
  const ChatSession::Turn t3 = session.say("The quick brown fox", words, 0, 12);
  EXPECT_EQ(t3.ids, t1.ids);
  EXPECT_EQ(t3.prefilled, t3.prompt_tokens);

  // A reply that fills the context stops there: capacity - prompt + 1 tokens (the last sampled,
  // never fed); the next turn no longer fits and is refused, the conversation unchanged.
  ChatSession tight(*model, *tok_, plain, int64_t(prompt1.size()) + 3);
  tight.add("system", "Numbers like 12345.");
  const ChatSession::Turn full = tight.say("The quick brown fox", words, 0, 12);
  EXPECT_EQ(full.finish_reason, "context");
  EXPECT_EQ(full.ids, reference(prompt1, 4, words, 0));
  ASSERT_EQ(tight.messages().size(), 3u);
  EXPECT_THROW(tight.say("More?", words, 0, 12), Error);
  EXPECT_EQ(tight.messages().size(), 3u);
  EXPECT_THROW(tight.say("More?", words, 0, 0), Error);  // max_tokens 0: no reply to add

  // A conversation that no longer fits is refused, and nothing of it is kept.
  ChatSession small(*model, *tok_, plain, 8);
  try {
    small.say("The quick brown fox jumps over the lazy dog", greedy, 0, 4);
    ADD_FAILURE() << "a conversation longer than the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves no room for a reply in the context of 8 positions"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(small.messages().empty());
}

}  // namespace
}  // namespace zaya::serve_test
